//! Azure File: `kubernetes.io/azure-file` <-> `file.csi.azure.com`, no topology. The handle is
//! `<resource group>#<account>#<share>#<PV name>#<namespace>`; the account's key is the Secret
//! `azure-storage-account-<account>-secret`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AzureFilePersistentVolumeSource, CSIPersistentVolumeSource, PersistentVolume, SecretReference,
};

use super::params::attribute;
use super::{Plugin, go_bool};

/// The PV annotation holding the resource group.
pub(crate) const RESOURCE_GROUP_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";

/// The storage account of a Secret named `azure-storage-account-<account>-secret`.
pub(crate) fn storage_account_name(secret: &str) -> Option<String> {
    // Upstream's own pattern: its `.` stops at a newline, which string searching did not.
    static PATTERN: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = PATTERN.get_or_init(|| {
        regex::Regex::new("azure-storage-account-(.+)-secret").expect("a valid pattern")
    });
    re.captures(secret)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_owned())
}

pub(crate) fn to_csi(pv: &mut PersistentVolume) -> Result<(), String> {
    let resource_group = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESOURCE_GROUP_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.get_or_insert_default();
    let file = spec
        .azure_file
        .take()
        .ok_or_else(|| "pv is nil or Azure File source not defined on pv".to_owned())?;
    let account =
        storage_account_name(&file.secret_name).unwrap_or_else(|| file.secret_name.clone());
    let namespace = match &file.secret_namespace {
        Some(ns) => ns.clone(),
        None => spec
            .claim_ref
            .as_ref()
            .and_then(|r| r.namespace.clone())
            .unwrap_or_default(),
    };
    if namespace.is_empty() {
        return Err(
            "could not find a secret namespace in PersistentVolumeSource or ClaimRef".to_owned(),
        );
    }
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: Plugin::AzureFile.csi_name().to_owned(),
        volume_handle: format!(
            "{resource_group}#{account}#{}#{name}#{namespace}",
            file.share_name
        ),
        read_only: go_bool(file.read_only),
        volume_attributes: Some(BTreeMap::from([(
            "sharename".to_owned(),
            file.share_name.clone(),
        )])),
        node_stage_secret_ref: Some(SecretReference {
            name: Some(file.secret_name),
            namespace: Some(namespace),
        }),
        ..CSIPersistentVolumeSource::default()
    });
    Ok(())
}

pub(crate) fn to_in_tree(
    pv: &mut PersistentVolume,
    csi: CSIPersistentVolumeSource,
) -> Result<(), String> {
    let attributes = csi.volume_attributes.as_ref();
    let mut share = attribute(attributes, "sharename")
        .cloned()
        .unwrap_or_default();
    let mut secret = attribute(attributes, "secretname")
        .cloned()
        .unwrap_or_default();
    let mut namespace = attribute(attributes, "secretnamespace").cloned();
    if let Some(r) = &csi.node_stage_secret_ref
        && r.name.as_deref().is_some_and(|n| !n.is_empty())
    {
        secret = r.name.clone().unwrap_or_default();
        namespace = Some(r.namespace.clone().unwrap_or_default());
    }
    let mut resource_group = None;
    if share.is_empty() || secret.is_empty() {
        let segments: Vec<&str> = csi.volume_handle.split('#').collect();
        if segments.len() < 3 {
            return Err(format!(
                "error parsing volume id: {}, should at least contain two #",
                crate::gofmt::quote(&csi.volume_handle)
            ));
        }
        if share.is_empty() {
            share = segments[2].to_owned();
        }
        if secret.is_empty() {
            secret = format!("azure-storage-account-{}-secret", segments[1]);
        }
        resource_group = Some(segments[0].to_owned());
    }
    let annotations = pv.metadata.annotations.get_or_insert_default();
    if let Some(rg) = resource_group.filter(|rg| !rg.is_empty()) {
        annotations.insert(RESOURCE_GROUP_ANNOTATION.to_owned(), rg);
    }
    pv.spec.get_or_insert_default().azure_file = Some(AzureFilePersistentVolumeSource {
        read_only: go_bool(csi.read_only),
        secret_name: secret,
        secret_namespace: Some(namespace.unwrap_or_else(|| "default".to_owned())),
        share_name: share,
    });
    Ok(())
}

#[cfg(test)]
#[path = "azure_file_tests.rs"]
mod tests;
