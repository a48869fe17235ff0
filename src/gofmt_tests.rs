use super::*;

/// What upstream prints for a clone source that is not Bound (checked against Go's output).
#[test]
fn a_claim_status_prints_as_gos_struct_value() {
    assert_eq!(claim_status(None), "{ [] map[] [] map[] map[] <nil> nil}");
    let pending = PersistentVolumeClaimStatus {
        phase: Some("Pending".into()),
        ..Default::default()
    };
    assert_eq!(
        claim_status(Some(&pending)),
        "{Pending [] map[] [] map[] map[] <nil> nil}"
    );
    let lost = PersistentVolumeClaimStatus {
        phase: Some("Lost".into()),
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        capacity: Some([("storage".to_owned(), Quantity("1Gi".into()))].into()),
        ..Default::default()
    };
    assert_eq!(
        claim_status(Some(&lost)),
        "{Lost [ReadWriteOnce] map[storage:{{1073741824 0} {<nil>} 1Gi BinarySI}] [] map[] map[] <nil> nil}"
    );
    assert_eq!(quantity_fields("2G"), "{{2 9} {<nil>} 2G DecimalSI}");
}

#[test]
fn quote_escapes_like_go() {
    assert_eq!(quote("a b"), r#""a b""#);
    assert_eq!(quote(r#"x"y\z"#), r#""x\"y\\z""#);
    assert_eq!(quote("tab\there\n"), r#""tab\there\n""#);
    assert_eq!(quote("\u{1}"), r#""\x01""#);
    assert_eq!(quote("zoné"), "\"zoné\"");
}

#[test]
fn lists_and_maps_render_like_go() {
    assert_eq!(quote_list(&["pvc.foo", "bar"]), r#"["pvc.foo" "bar"]"#);
    assert_eq!(list(&["a", "b"]), "[a b]");
    let mut m = BTreeMap::new();
    m.insert("b".to_owned(), "2".to_owned());
    m.insert("a".to_owned(), "1".to_owned());
    assert_eq!(map(Some(&m)), "map[a:1 b:2]");
    assert_eq!(map(None), "map[]");
}
