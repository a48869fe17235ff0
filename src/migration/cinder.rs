//! OpenStack Cinder: `kubernetes.io/cinder` <-> `cinder.csi.openstack.org`, zones under
//! `topology.cinder.csi.openstack.org/zone` (no region).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CinderPersistentVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::params::{CSI_FSTYPE, Param, map_params, set_topologies, with_params};
use super::topology::{csi_to_in_tree, in_tree_to_csi};
use super::{Plugin, go_bool, go_string, topology_error};

/// The driver's zone key.
pub(crate) const ZONE_KEY: &str = "topology.cinder.csi.openstack.org/zone";

/// `fstype` renamed; everything else (`availability` included) passes through; allowed
/// topologies get the driver's zone key.
pub(crate) fn translate_class(sc: &StorageClass) -> Result<StorageClass, String> {
    let (params, _) = map_params(sc, |lower, key, value| match lower {
        "fstype" => Param::Keep(CSI_FSTYPE.to_owned(), value.to_owned()),
        _ => Param::Keep(key.to_owned(), value.to_owned()),
    });
    let mut out = with_params(sc, params);
    set_topologies(&mut out, None, ZONE_KEY)?;
    Ok(out)
}

pub(crate) fn to_csi(pv: &mut PersistentVolume) -> Result<(), String> {
    let spec = pv.spec.get_or_insert_default();
    let cinder = spec
        .cinder
        .take()
        .ok_or_else(|| "pv is nil or Cinder not defined on pv".to_owned())?;
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: Plugin::Cinder.csi_name().to_owned(),
        volume_handle: cinder.volume_id,
        read_only: go_bool(cinder.read_only),
        fs_type: go_string(cinder.fs_type),
        volume_attributes: Some(BTreeMap::new()),
        ..CSIPersistentVolumeSource::default()
    });
    in_tree_to_csi(pv, ZONE_KEY);
    Ok(())
}

pub(crate) fn to_in_tree(
    pv: &mut PersistentVolume,
    csi: CSIPersistentVolumeSource,
) -> Result<(), String> {
    pv.spec.get_or_insert_default().cinder = Some(CinderPersistentVolumeSource {
        volume_id: csi.volume_handle,
        fs_type: go_string(csi.fs_type),
        read_only: go_bool(csi.read_only),
        secret_ref: None,
    });
    csi_to_in_tree(pv, ZONE_KEY, None).map_err(|e| topology_error(pv, &e))
}

#[cfg(test)]
#[path = "cinder_tests.rs"]
mod tests;
