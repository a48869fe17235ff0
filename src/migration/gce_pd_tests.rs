//! Upstream's csi-translation-lib vectors for GCE PD (restated).

use super::*;
use crate::migration::params::test_support::{Pairs, class, map, topo};
use crate::migration::topology::GA_ZONE;

#[test]
fn class_parameters_and_zones_translate_as_upstreams() {
    let plain: [(Pairs, Pairs); 3] = [
        (&[("foo", "bar")], &[("foo", "bar")]),
        (
            &[("fstype", "myfs")],
            &[("csi.storage.k8s.io/fstype", "myfs")],
        ),
        (&[], &[]),
    ];
    for (input, want) in plain {
        let out = translate_class(&class(input, None)).unwrap();
        assert_eq!(out.parameters.unwrap(), map(want));
        assert_eq!(out.allowed_topologies, None);
    }
    let out = translate_class(&class(&[("zone", "foo")], None)).unwrap();
    assert_eq!(out.parameters.unwrap(), map(&[]));
    assert_eq!(out.allowed_topologies, Some(topo(ZONE_KEY, &["foo"])));
    let out = translate_class(&class(&[("zones", "foo,bar,baz")], None)).unwrap();
    assert_eq!(
        out.allowed_topologies,
        Some(topo(ZONE_KEY, &["foo", "bar", "baz"]))
    );
    let out = translate_class(&class(&[], Some(topo(ZONE_KEY, &["foo"])))).unwrap();
    assert_eq!(out.allowed_topologies, Some(topo(ZONE_KEY, &["foo"])));
    let beta = crate::migration::topology::BETA_ZONE;
    let out = translate_class(&class(&[], Some(topo(beta, &["foo"])))).unwrap();
    assert_eq!(out.allowed_topologies, Some(topo(ZONE_KEY, &["foo"])));
    assert_eq!(
        translate_class(&class(&[("zone", "foo")], Some(topo(ZONE_KEY, &["foo"])))).unwrap_err(),
        "cannot simultaneously set allowed topologies and zone/zones parameters"
    );
    // A regional class passes through: no regional topology logic in this version.
    let out = translate_class(&class(&[("replication-type", "regional-pd")], None)).unwrap();
    assert_eq!(
        out.parameters.unwrap(),
        map(&[("replication-type", "regional-pd")])
    );
}

#[test]
fn access_modes_are_the_ones_a_pd_supports() {
    let m = |v: &[&str]| Some(v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    let cases: [(&[&str], &str); 7] = [
        (&["ReadOnlyMany"], "ReadOnlyMany"),
        (&["ReadWriteOnce"], "ReadWriteOnce"),
        (&["ReadWriteMany"], "ReadWriteOnce"),
        (&["ReadOnlyMany", "ReadWriteOnce"], "ReadWriteOnce"),
        (&["ReadWriteOnce", "ReadWriteMany"], "ReadWriteOnce"),
        (&["ReadWriteMany", "ReadOnlyMany"], "ReadWriteOnce"),
        (
            &["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"],
            "ReadWriteOnce",
        ),
    ];
    for (input, want) in cases {
        assert_eq!(
            backward_compatible_access_modes(m(input).as_deref()),
            m(&[want]),
            "{input:?}"
        );
    }
    assert_eq!(backward_compatible_access_modes(None), None);
}

fn pd_with_labels(labels: &[(&str, &str)]) -> PersistentVolume {
    let mut pv = PersistentVolume::default();
    pv.metadata.labels = Some(map(labels));
    pv.spec.get_or_insert_default().gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
        pd_name: "pd-name".into(),
        ..Default::default()
    });
    pv
}

#[test]
fn the_handle_names_the_zone_or_the_region_from_the_labels() {
    let beta = crate::migration::topology::BETA_ZONE;
    for key in [beta, GA_ZONE] {
        let csi = Plugin::GcePd
            .in_tree_to_csi(&pd_with_labels(&[(key, "us-east1-a")]))
            .unwrap();
        assert_eq!(
            csi.spec.unwrap().csi.unwrap().volume_handle,
            "projects/UNSPECIFIED/zones/us-east1-a/disks/pd-name"
        );
        let csi = Plugin::GcePd
            .in_tree_to_csi(&pd_with_labels(&[(key, "us-central1-a__us-central1-c")]))
            .unwrap();
        assert_eq!(
            csi.spec.unwrap().csi.unwrap().volume_handle,
            "projects/UNSPECIFIED/regions/us-central1/disks/pd-name"
        );
    }
    let csi = Plugin::GcePd.in_tree_to_csi(&pd_with_labels(&[])).unwrap();
    assert_eq!(
        csi.spec.unwrap().csi.unwrap().volume_handle,
        "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/pd-name"
    );
}

#[test]
fn a_pd_round_trips_and_a_short_handle_is_refused() {
    let mut pv = PersistentVolume::default();
    pv.spec.get_or_insert_default().gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
        pd_name: "test-disk".into(),
        fs_type: Some("ext4".into()),
        partition: None,
        read_only: None,
    });
    let csi = Plugin::GcePd.in_tree_to_csi(&pv).unwrap();
    assert_eq!(Plugin::GcePd.csi_to_in_tree(&csi).unwrap(), pv);
    let mut short = PersistentVolume::default();
    short.spec.get_or_insert_default().csi = Some(CSIPersistentVolumeSource {
        driver: "pd.csi.storage.gke.io".into(),
        volume_handle: "projects/p/zones/z".into(),
        ..Default::default()
    });
    assert_eq!(
        Plugin::GcePd.csi_to_in_tree(&short).unwrap_err(),
        "failed to get id components.Got: 4, wanted 6 components or more. "
    );
}
