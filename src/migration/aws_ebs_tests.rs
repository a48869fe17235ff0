//! Upstream's csi-translation-lib vectors for AWS EBS (restated).

use super::*;
use crate::migration::params::test_support::{Pairs, class, map};

#[test]
fn kubernetes_volume_ids_become_ebs_ids() {
    for id in [
        "vol-02399794d890f9375",
        "aws:///vol-02399794d890f9375",
        "aws://us-west-2a/vol-02399794d890f9375",
    ] {
        assert_eq!(ebs_volume_id(id).unwrap(), "vol-02399794d890f9375", "{id}");
    }
    assert_eq!(
        ebs_volume_id("aws://us-west-2a/02399794d890f9375").unwrap_err(),
        "Invalid format for AWS volume (aws://us-west-2a/02399794d890f9375)"
    );
}

#[test]
fn class_parameters_translate_as_upstreams() {
    let cases: [(Pairs, Pairs); 4] = [
        (&[("foo", "bar")], &[("foo", "bar")]),
        (&[], &[]),
        (
            &[("fstype", "ext3")],
            &[("csi.storage.k8s.io/fstype", "ext3")],
        ),
        (
            &[("iopsPerGB", "100")],
            &[("iopsPerGB", "100"), ("allowautoiopspergbincrease", "true")],
        ),
    ];
    for (input, want) in cases {
        let out = translate_class(&class(input, None)).unwrap();
        assert_eq!(out.parameters.unwrap(), map(want), "{input:?}");
        assert_eq!(out.allowed_topologies, None);
    }
    // Case-insensitive keys.
    let out = translate_class(&class(&[("FsType", "xfs"), ("Zone", "us-east-1a")], None)).unwrap();
    assert_eq!(
        out.parameters.unwrap(),
        map(&[("csi.storage.k8s.io/fstype", "xfs")])
    );
    assert_eq!(
        out.allowed_topologies,
        Some(crate::migration::params::test_support::topo(
            ZONE_KEY,
            &["us-east-1a"]
        ))
    );
}

#[test]
fn an_ebs_pv_round_trips_with_its_partition() {
    let mut pv = PersistentVolume::default();
    pv.spec.get_or_insert_default().aws_elastic_block_store =
        Some(AWSElasticBlockStoreVolumeSource {
            volume_id: "vol01".into(),
            fs_type: Some("ext3".into()),
            partition: Some(1),
            read_only: Some(true),
        });
    let csi = Plugin::AwsEbs.in_tree_to_csi(&pv).unwrap();
    let source = csi.spec.as_ref().unwrap().csi.clone().unwrap();
    assert_eq!(source.driver, "ebs.csi.aws.com");
    assert_eq!(source.volume_handle, "vol01");
    assert_eq!(source.volume_attributes.unwrap()["partition"], "1");
    assert_eq!(Plugin::AwsEbs.csi_to_in_tree(&csi).unwrap(), pv);
}

#[test]
fn a_partition_that_is_no_number_is_refused() {
    let mut pv = PersistentVolume::default();
    pv.spec.get_or_insert_default().csi = Some(CSIPersistentVolumeSource {
        driver: "ebs.csi.aws.com".into(),
        volume_handle: "vol-1".into(),
        volume_attributes: Some([("partition".to_owned(), String::new())].into()),
        ..Default::default()
    });
    assert_eq!(
        Plugin::AwsEbs.csi_to_in_tree(&pv).unwrap_err(),
        "failed to convert partition  to integer: strconv.Atoi: parsing \"\": invalid syntax"
    );
}
