//! Upstream's csi-translation-lib vectors for Azure Disk (restated).

use super::*;
use crate::migration::params::test_support::{class, map, topo};
use crate::migration::topology::GA_ZONE;

const URI: &str = "/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name";

#[test]
fn managed_and_unmanaged_disk_names() {
    let managed =
        "testurl/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name";
    assert!(is_managed_disk(managed));
    assert!(is_managed_disk("test.com"));
    assert!(!is_managed_disk("HTTP://test.com"));
    assert!(!is_managed_disk("http://test.com/vhds/name"));
    assert_eq!(disk_name(managed).unwrap(), "name");
    assert_eq!(disk_name("http://test.com/vhds/name").unwrap(), "name");
    let bad = "testurl/subscriptions/23/providers/Microsoft.Compute/disks/name";
    assert_eq!(
        disk_name(bad).unwrap_err(),
        format!("could not get disk name from {bad}, correct format: {MANAGED_DISK_PATTERN}")
    );
    assert_eq!(
        disk_name("http://test.io/name").unwrap_err(),
        format!(
            "could not get disk name from http://test.io/name, correct format: {UNMANAGED_DISK_PATTERN}"
        )
    );
}

#[test]
fn class_zones_and_numeric_zone_values() {
    let out = translate_class(&class(&[("foo", "bar"), ("fstype", "ext4")], None)).unwrap();
    assert_eq!(
        out.parameters.unwrap(),
        map(&[("foo", "bar"), ("fstype", "ext4")]),
        "fstype kept"
    );
    let out = translate_class(&class(&[("zone", "foo")], None)).unwrap();
    assert_eq!(out.allowed_topologies, Some(topo(ZONE_KEY, &["foo"])));
    let out = translate_class(&class(&[("zones", "foo,bar,baz")], None)).unwrap();
    assert_eq!(
        out.allowed_topologies,
        Some(topo(ZONE_KEY, &["foo", "bar", "baz"]))
    );
    let out = translate_class(&class(&[], Some(topo(GA_ZONE, &["foo"])))).unwrap();
    assert_eq!(out.allowed_topologies, Some(topo(ZONE_KEY, &["foo"])));
    let out = translate_class(&class(&[("zone", "1")], None)).unwrap();
    assert_eq!(
        out.allowed_topologies,
        Some(topo(ZONE_KEY, &[""])),
        "numeric zones emptied"
    );
    let out = translate_class(&class(&[], Some(topo(GA_ZONE, &["1", "eastus-1"])))).unwrap();
    assert_eq!(
        out.allowed_topologies,
        Some(topo(ZONE_KEY, &["", "eastus-1"]))
    );
}

#[test]
fn an_in_tree_disk_becomes_csi_and_dedicated_disks_are_refused() {
    let mut pv = PersistentVolume::default();
    pv.spec.get_or_insert_default().azure_disk = Some(AzureDiskVolumeSource {
        caching_mode: Some("cachingmode".into()),
        disk_uri: URI.into(),
        fs_type: Some("fstype".into()),
        read_only: Some(true),
        ..Default::default()
    });
    let csi = Plugin::AzureDisk
        .in_tree_to_csi(&pv)
        .unwrap()
        .spec
        .unwrap()
        .csi
        .unwrap();
    assert_eq!(csi.fs_type.as_deref(), Some("fstype"));
    assert_eq!(csi.read_only, Some(true));
    assert_eq!(csi.volume_handle, URI);
    assert_eq!(
        csi.volume_attributes.unwrap(),
        map(&[
            ("cachingmode", "cachingmode"),
            ("fstype", "fstype"),
            ("kind", "Managed")
        ])
    );
    pv.spec.as_mut().unwrap().azure_disk.as_mut().unwrap().kind = Some("Dedicated".into());
    assert_eq!(
        Plugin::AzureDisk.in_tree_to_csi(&pv).unwrap_err(),
        "kind(Dedicated) is not supported in csi migration"
    );
}

#[test]
fn a_csi_disk_is_written_back_with_its_caching_mode_whatever_the_attribute_case() {
    for (attrs, caching) in [
        (
            &[
                ("cachingmode", "ReadOnly"),
                ("fstype", "fstype"),
                ("kind", "managed"),
            ][..],
            "ReadOnly",
        ),
        (
            &[
                ("cachingMode", "None"),
                ("fsType", "fstype"),
                ("kind", "managed"),
            ][..],
            "None",
        ),
        (
            &[
                ("cachingMode", "ReadWrite"),
                ("fsType", "fstype"),
                ("kind", "managed"),
            ][..],
            "ReadWrite",
        ),
    ] {
        let mut pv = PersistentVolume::default();
        pv.spec.get_or_insert_default().csi = Some(CSIPersistentVolumeSource {
            driver: "disk.csi.azure.com".into(),
            fs_type: Some("fstype".into()),
            read_only: Some(true),
            volume_handle: URI.into(),
            volume_attributes: Some(map(attrs)),
            ..Default::default()
        });
        let disk = Plugin::AzureDisk
            .csi_to_in_tree(&pv)
            .unwrap()
            .spec
            .unwrap()
            .azure_disk
            .unwrap();
        assert_eq!(
            disk,
            AzureDiskVolumeSource {
                caching_mode: Some(caching.into()),
                disk_name: "name".into(),
                disk_uri: URI.into(),
                fs_type: Some("fstype".into()),
                kind: Some("Managed".into()),
                read_only: Some(true),
            }
        );
    }
}

/// Found by `any_csi_pv_of_the_seven_translates_both_ways_or_fails_in_upstreams_words`: a handle
/// with a character across byte 4 panicked on a string slice; Go compares the first four bytes.
#[test]
fn a_handle_with_a_wide_character_at_byte_four_is_a_managed_disk_not_a_panic() {
    assert!(is_managed_disk("z\u{1F893}=D"));
    assert!(is_managed_disk("htt\u{e9}://x/vhds/d"));
    assert_eq!(
        disk_name("z\u{1F893}=D"),
        Err(format!(
            "could not get disk name from z\u{1F893}=D, correct format: {MANAGED_DISK_PATTERN}"
        ))
    );
}
