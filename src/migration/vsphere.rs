//! vSphere: `kubernetes.io/vsphere-volume` <-> `csi.vsphere.vmware.com`, zone and region under
//! `topology.csi.vmware.com/zone` and `/region`. Only a fixed set of class parameters carries
//! over (renamed `*-migrationparam`), plus `csimigration: "true"`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::params::{CSI_FSTYPE, Param, map_params, set_topologies, with_params};
use super::topology::{add_topology, replace_topology, topology_labels, topology_values};
use super::{Plugin, go_string};

/// The driver's zone key.
pub(crate) const ZONE_KEY: &str = "topology.csi.vmware.com/zone";
/// The driver's region key.
pub(crate) const REGION_KEY: &str = "topology.csi.vmware.com/region";
/// The volume attribute the driver puts the in-tree volume path in.
pub(crate) const VOLUME_PATH_ATTRIBUTE: &str = "initialvolumefilepath";

/// The parameters that carry over, by their key in lower case.
fn carried(lower: &str) -> Option<&'static str> {
    Some(match lower {
        "fstype" => CSI_FSTYPE,
        "storagepolicyname" => "storagepolicyname",
        "datastore" => "datastore-migrationparam",
        "diskformat" => "diskformat-migrationparam",
        "hostfailurestotolerate" => "hostfailurestotolerate-migrationparam",
        "forceprovisioning" => "forceprovisioning-migrationparam",
        "cachereservation" => "cachereservation-migrationparam",
        "diskstripes" => "diskstripes-migrationparam",
        "objectspacereservation" => "objectspacereservation-migrationparam",
        "iopslimit" => "iopslimit-migrationparam",
        _ => return None,
    })
}

pub(crate) fn translate_class(sc: &StorageClass) -> Result<StorageClass, String> {
    let (mut params, _) = map_params(sc, |lower, _, value| match carried(lower) {
        Some(key) => Param::Keep(key.to_owned(), value.to_owned()),
        None => Param::Drop,
    });
    params.insert("csimigration".to_owned(), "true".to_owned());
    let mut out = with_params(sc, params);
    set_topologies(&mut out, None, ZONE_KEY)?;
    Ok(out)
}

pub(crate) fn to_csi(pv: &mut PersistentVolume) -> Result<(), String> {
    let spec = pv.spec.get_or_insert_default();
    let disk = spec
        .vsphere_volume
        .take()
        .ok_or_else(|| "pv is nil or VsphereVolume not defined on pv".to_owned())?;
    let mut attributes = BTreeMap::new();
    if let Some(policy) = disk.storage_policy_name.filter(|p| !p.is_empty()) {
        attributes.insert("storagepolicyname".to_owned(), policy);
    }
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: Plugin::Vsphere.csi_name().to_owned(),
        volume_handle: disk.volume_path,
        fs_type: go_string(disk.fs_type),
        volume_attributes: Some(attributes),
        ..CSIPersistentVolumeSource::default()
    });
    let (zone_label, region_label) = topology_labels(pv);
    for (label, key) in [(zone_label, ZONE_KEY), (region_label, REGION_KEY)] {
        if !topology_values(pv, label).is_empty() {
            replace_topology(pv, label, key);
        } else if let Some(value) = pv
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(label))
            .filter(|v| !v.is_empty())
            .cloned()
        {
            let _ = add_topology(pv, key, &[value]);
        }
    }
    Ok(())
}

pub(crate) fn to_in_tree(
    pv: &mut PersistentVolume,
    csi: CSIPersistentVolumeSource,
) -> Result<(), String> {
    let path = csi
        .volume_attributes
        .as_ref()
        .and_then(|a| a.get(VOLUME_PATH_ATTRIBUTE))
        .cloned()
        .unwrap_or_default();
    pv.spec.get_or_insert_default().vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
        fs_type: go_string(csi.fs_type),
        volume_path: path,
        storage_policy_id: None,
        storage_policy_name: None,
    });
    let (zone_label, region_label) = topology_labels(pv);
    replace_topology(pv, ZONE_KEY, zone_label);
    replace_topology(pv, REGION_KEY, region_label);
    for label in [zone_label, region_label] {
        let values = topology_values(pv, label);
        let labels = pv.metadata.labels.get_or_insert_default();
        if let Some(first) = values.first()
            && !labels.contains_key(label)
        {
            labels.insert(label.to_owned(), first.clone());
        }
    }
    if pv.metadata.labels.as_ref().is_some_and(BTreeMap::is_empty) {
        pv.metadata.labels = None;
    }
    Ok(())
}

#[cfg(test)]
#[path = "vsphere_tests.rs"]
mod tests;
