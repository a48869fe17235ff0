use super::*;

#[test]
fn only_what_is_requested_and_missing_is_reported_off() {
    let none = ServedKinds {
        volume_attributes_class: false,
        storage_capacity: false,
    };
    let all = ServedKinds {
        volume_attributes_class: true,
        storage_capacity: true,
    };
    let off = features_off(true, true, &none);
    assert_eq!(off.len(), 2);
    assert!(off[0].starts_with("VolumeAttributesClass"), "{off:?}");
    assert!(off[1].starts_with("storage capacity tracking"), "{off:?}");
    assert!(features_off(false, false, &none).is_empty());
    assert!(features_off(true, true, &all).is_empty());
    assert_eq!(features_off(false, true, &none).len(), 1);
}
