//! GCE PD: `kubernetes.io/gce-pd` <-> `pd.csi.storage.gke.io`, zones under
//! `topology.gke.io/zone`; a regional disk's handle names its region.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::params::{map_params, set_topologies, with_params, zonal_rule};
use super::topology::{
    BETA_ZONE, GA_ZONE, ZONES_DELIMITER, csi_to_in_tree, gce_region, in_tree_to_csi,
};
use super::{Plugin, go_bool, go_string, topology_error};

/// The driver's zone key.
pub(crate) const ZONE_KEY: &str = "topology.gke.io/zone";
const UNSPECIFIED: &str = "UNSPECIFIED";

/// `fstype` renamed, `zone` / `zones` to allowed topologies; everything else (including
/// `replication-type`) passes through.
pub(crate) fn translate_class(sc: &StorageClass) -> Result<StorageClass, String> {
    let (params, zones) = map_params(sc, |lower, key, value| zonal_rule(lower, key, value, true));
    let mut out = with_params(sc, params);
    set_topologies(&mut out, zones, ZONE_KEY)?;
    Ok(out)
}

/// The access modes a PD supports, from the PV's: ReadWriteMany counts as ReadWriteOnce.
pub(crate) fn backward_compatible_access_modes(modes: Option<&[String]>) -> Option<Vec<String>> {
    let modes = modes?;
    let (mut rwo, mut rox) = (false, false);
    for m in modes {
        match m.as_str() {
            "ReadWriteOnce" | "ReadWriteMany" => rwo = true,
            "ReadOnlyMany" => rox = true,
            _ => {}
        }
    }
    Some(vec![
        if !rwo && rox {
            "ReadOnlyMany"
        } else {
            "ReadWriteOnce"
        }
        .to_owned(),
    ])
}

pub(crate) fn to_csi(pv: &mut PersistentVolume) -> Result<(), String> {
    let label = |key: &str| {
        pv.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let zones_label = label(BETA_ZONE).or_else(|| label(GA_ZONE));
    let spec = pv.spec.get_or_insert_default();
    let pd = spec
        .gce_persistent_disk
        .take()
        .ok_or_else(|| "pv is nil or GCE Persistent Disk source not defined on pv".to_owned())?;
    let zones: Vec<&str> = zones_label
        .as_deref()
        .map(|z| z.split(ZONES_DELIMITER).collect())
        .unwrap_or_default();
    let handle = match zones.as_slice() {
        [zone] if !zone.is_empty() => {
            format!("projects/{UNSPECIFIED}/zones/{zone}/disks/{}", pd.pd_name)
        }
        many if many.len() > 1 => {
            let owned: Vec<String> = many.iter().map(|z| (*z).to_owned()).collect();
            let region =
                gce_region(&owned).map_err(|e| format!("failed to get region from zones: {e}"))?;
            format!(
                "projects/{UNSPECIFIED}/regions/{region}/disks/{}",
                pd.pd_name
            )
        }
        _ => format!(
            "projects/{UNSPECIFIED}/zones/{UNSPECIFIED}/disks/{}",
            pd.pd_name
        ),
    };
    let partition = match pd.partition.unwrap_or(0) {
        0 => String::new(),
        n => n.to_string(),
    };
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: Plugin::GcePd.csi_name().to_owned(),
        volume_handle: handle,
        read_only: go_bool(pd.read_only),
        fs_type: go_string(pd.fs_type),
        volume_attributes: Some(BTreeMap::from([("partition".to_owned(), partition)])),
        ..CSIPersistentVolumeSource::default()
    });
    spec.access_modes = backward_compatible_access_modes(spec.access_modes.as_deref());
    in_tree_to_csi(pv, ZONE_KEY);
    Ok(())
}

pub(crate) fn to_in_tree(
    pv: &mut PersistentVolume,
    csi: CSIPersistentVolumeSource,
) -> Result<(), String> {
    let parts: Vec<&str> = csi.volume_handle.split('/').collect();
    if parts.len() < 6 {
        return Err(format!(
            "failed to get id components.Got: {}, wanted 6 components or more. ",
            parts.len()
        ));
    }
    let partition = match csi
        .volume_attributes
        .as_ref()
        .and_then(|a| a.get("partition"))
        .filter(|p| !p.is_empty())
    {
        Some(p) => Some(p.parse::<i32>().map_err(|_| {
            format!(
                "Failed to convert partition {p} to integer: strconv.Atoi: parsing {}: invalid syntax",
                crate::gofmt::quote(p)
            )
        })?),
        None => None,
    };
    pv.spec.get_or_insert_default().gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
        pd_name: parts[5].to_owned(),
        fs_type: go_string(csi.fs_type),
        read_only: go_bool(csi.read_only),
        partition: partition.filter(|p| *p != 0),
    });
    csi_to_in_tree(pv, ZONE_KEY, Some(gce_region)).map_err(|e| topology_error(pv, &e))
}

#[cfg(test)]
#[path = "gce_pd_tests.rs"]
mod tests;
