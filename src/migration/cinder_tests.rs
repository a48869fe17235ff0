//! Upstream's csi-translation-lib vectors for Cinder (restated).

use super::*;
use crate::migration::params::test_support::{Pairs, class, map, topo};
use crate::migration::topology::BETA_ZONE;

#[test]
fn class_parameters_and_topologies_translate_as_upstreams() {
    let cases: [(Pairs, Pairs); 4] = [
        (&[("foo", "bar")], &[("foo", "bar")]),
        (&[], &[]),
        (
            &[("fstype", "ext3")],
            &[("csi.storage.k8s.io/fstype", "ext3")],
        ),
        (&[("availability", "nova")], &[("availability", "nova")]),
    ];
    for (input, want) in cases {
        let out = translate_class(&class(input, None)).unwrap();
        assert_eq!(out.parameters.unwrap(), map(want));
        assert_eq!(out.allowed_topologies, None, "availability is no topology");
    }
    let out = translate_class(&class(&[], Some(topo(BETA_ZONE, &["nova"])))).unwrap();
    assert_eq!(out.allowed_topologies, Some(topo(ZONE_KEY, &["nova"])));
}

#[test]
fn a_cinder_volume_round_trips() {
    let mut pv = PersistentVolume::default();
    pv.spec.get_or_insert_default().cinder = Some(CinderPersistentVolumeSource {
        volume_id: "v1".into(),
        fs_type: Some("ext4".into()),
        read_only: None,
        secret_ref: None,
    });
    let csi = Plugin::Cinder.in_tree_to_csi(&pv).unwrap();
    assert_eq!(
        csi.spec
            .as_ref()
            .unwrap()
            .csi
            .as_ref()
            .unwrap()
            .volume_handle,
        "v1"
    );
    assert_eq!(Plugin::Cinder.csi_to_in_tree(&csi).unwrap(), pv);
}
