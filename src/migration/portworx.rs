//! Portworx: `kubernetes.io/portworx-volume` <-> `pxd.portworx.com`, no topology; the auth
//! secret of the class (or the PV's annotations) becomes every CSI secret.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PortworxVolumeSource, SecretReference,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{Plugin, go_bool, go_string};

/// The class parameter and PV annotation naming the auth secret.
pub(crate) const AUTH_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
/// ... and its namespace.
pub(crate) const AUTH_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";
const SECRET_KINDS: [&str; 6] = [
    "provisioner",
    "controller-publish",
    "node-publish",
    "node-stage",
    "controller-expand",
    "node-expand",
];

/// The auth secret becomes every `csi.storage.k8s.io/*-secret-*` key; the provisioner becomes
/// the CSI driver's (the only plugin whose class changes it).
pub(crate) fn translate_class(sc: &StorageClass) -> Result<StorageClass, String> {
    let mut params = BTreeMap::new();
    for (key, value) in sc.parameters.iter().flatten() {
        let suffix = match key.to_lowercase().as_str() {
            AUTH_SECRET_NAME => Some("name"),
            AUTH_SECRET_NAMESPACE => Some("namespace"),
            _ => None,
        };
        match suffix {
            Some(suffix) => {
                for kind in SECRET_KINDS {
                    params.insert(
                        format!("csi.storage.k8s.io/{kind}-secret-{suffix}"),
                        value.clone(),
                    );
                }
            }
            None => {
                params.insert(key.clone(), value.clone());
            }
        }
    }
    let mut out = sc.clone();
    if !params.is_empty() {
        out.parameters = Some(params);
    }
    out.provisioner = Plugin::Portworx.csi_name().to_owned();
    Ok(out)
}

pub(crate) fn to_csi(pv: &mut PersistentVolume) -> Result<(), String> {
    let secret = pv.metadata.annotations.as_ref().and_then(|a| {
        Some(SecretReference {
            name: Some(a.get(AUTH_SECRET_NAME)?.clone()),
            namespace: Some(a.get(AUTH_SECRET_NAMESPACE)?.clone()),
        })
    });
    let spec = pv.spec.get_or_insert_default();
    let px = spec
        .portworx_volume
        .take()
        .ok_or_else(|| "pv is nil or PortworxVolume not defined on pv".to_owned())?;
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: Plugin::Portworx.csi_name().to_owned(),
        volume_handle: px.volume_id,
        fs_type: go_string(px.fs_type),
        volume_attributes: Some(BTreeMap::new()),
        controller_publish_secret_ref: secret.clone(),
        node_stage_secret_ref: secret.clone(),
        node_publish_secret_ref: secret.clone(),
        controller_expand_secret_ref: secret.clone(),
        node_expand_secret_ref: secret,
        ..CSIPersistentVolumeSource::default()
    });
    Ok(())
}

pub(crate) fn to_in_tree(pv: &mut PersistentVolume, csi: CSIPersistentVolumeSource) {
    pv.spec.get_or_insert_default().portworx_volume = Some(PortworxVolumeSource {
        volume_id: csi.volume_handle,
        fs_type: go_string(csi.fs_type),
        read_only: go_bool(csi.read_only),
    });
}

#[cfg(test)]
#[path = "portworx_tests.rs"]
mod tests;
