//! Azure Disk: `kubernetes.io/azure-disk` <-> `disk.csi.azure.com`, class zones under
//! `topology.disk.csi.azure.com/zone` (the PV's topology is not translated).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AzureDiskVolumeSource, CSIPersistentVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::params::{attribute, map_params, set_topologies, with_params, zonal_rule};
use super::{Plugin, go_bool};

/// The driver's zone key.
pub(crate) const ZONE_KEY: &str = "topology.disk.csi.azure.com/zone";
/// A managed disk's URI, the disk name captured.
pub(crate) const MANAGED_DISK_PATTERN: &str =
    ".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)";
/// An unmanaged disk's (blob) URI, the disk name captured.
pub(crate) const UNMANAGED_DISK_PATTERN: &str = "http(?:.*)://(?:.*)/vhds/(.+)";

/// `zone` / `zones` to allowed topologies (`fstype` stays as it is); then every all-digit zone
/// value of the driver's key becomes empty (Azure's numeric zones are not the driver's).
pub(crate) fn translate_class(sc: &StorageClass) -> Result<StorageClass, String> {
    let (params, zones) = map_params(sc, |lower, key, value| zonal_rule(lower, key, value, false));
    let mut out = with_params(sc, params);
    set_topologies(&mut out, zones, ZONE_KEY)?;
    for term in out.allowed_topologies.iter_mut().flatten() {
        for e in term.match_label_expressions.iter_mut().flatten() {
            if e.key == ZONE_KEY {
                for v in &mut e.values {
                    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                        v.clear();
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Whether `uri` names a managed disk (anything but an `http...` blob URI).
pub(crate) fn is_managed_disk(uri: &str) -> bool {
    // By bytes, as Go's `diskURI[:4]`: a character across byte 4 must not panic.
    !(uri.len() > 4 && uri.as_bytes()[..4].eq_ignore_ascii_case(b"http"))
}

/// The disk name in a disk URI.
pub(crate) fn disk_name(uri: &str) -> Result<String, String> {
    static MANAGED: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    static UNMANAGED: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let (pattern, cell) = if is_managed_disk(uri) {
        (MANAGED_DISK_PATTERN, &MANAGED)
    } else {
        (UNMANAGED_DISK_PATTERN, &UNMANAGED)
    };
    let re = cell.get_or_init(|| regex::Regex::new(pattern).expect("a valid pattern"));
    re.captures(uri)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_owned())
        .ok_or_else(|| format!("could not get disk name from {uri}, correct format: {pattern}"))
}

pub(crate) fn to_csi(pv: &mut PersistentVolume) -> Result<(), String> {
    let spec = pv.spec.get_or_insert_default();
    let disk = spec
        .azure_disk
        .take()
        .ok_or_else(|| "pv is nil or Azure Disk source not defined on pv".to_owned())?;
    if let Some(kind) = disk.kind.as_deref()
        && !kind.eq_ignore_ascii_case("Managed")
    {
        return Err(format!("kind({kind}) is not supported in csi migration"));
    }
    let mut attributes = BTreeMap::from([("kind".to_owned(), "Managed".to_owned())]);
    if let Some(caching) = &disk.caching_mode {
        attributes.insert("cachingmode".to_owned(), caching.clone());
    }
    let fs_type = disk.fs_type.clone().filter(|f| !f.is_empty());
    if let Some(fs) = &fs_type {
        attributes.insert("fstype".to_owned(), fs.clone());
    }
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: Plugin::AzureDisk.csi_name().to_owned(),
        volume_handle: disk.disk_uri,
        read_only: go_bool(disk.read_only),
        fs_type,
        volume_attributes: Some(attributes),
        ..CSIPersistentVolumeSource::default()
    });
    Ok(())
}

pub(crate) fn to_in_tree(
    pv: &mut PersistentVolume,
    csi: CSIPersistentVolumeSource,
) -> Result<(), String> {
    let name = disk_name(&csi.volume_handle)?;
    let attributes = csi.volume_attributes.as_ref();
    let caching = attribute(attributes, "cachingmode").filter(|c| !c.is_empty());
    let fs_type = attribute(attributes, "fstype")
        .filter(|f| !f.is_empty())
        .cloned()
        .or(csi.fs_type.clone())
        .unwrap_or_default();
    pv.spec.get_or_insert_default().azure_disk = Some(AzureDiskVolumeSource {
        caching_mode: caching.cloned(),
        disk_name: name,
        disk_uri: csi.volume_handle,
        fs_type: Some(fs_type),
        kind: Some("Managed".to_owned()),
        read_only: Some(csi.read_only.unwrap_or(false)),
    });
    Ok(())
}

#[cfg(test)]
#[path = "azure_disk_tests.rs"]
mod tests;
