//! Azure File: `kubernetes.io/azure-file` <-> `file.csi.azure.com`, no topology. The driver's
//! volume id is `<resource group>#<account>#<share>#<disk>#<uuid>#<namespace>[#<subscription>]`
//! (an empty resource group: the cluster's own); upstream rebuilds an in-tree PV's as
//! `<resource group>#<account>#<share>#<PV name>#<namespace>`, the account read from a Secret
//! named `azure-storage-account-<account>-secret`.
//!
//! Differs from upstream (issue 41): the in-tree source cannot hold the account when its secret
//! is not named after it (a node-stage secret of the class), so upstream deletes a share that
//! does not exist and the real one stays. A PV written back here keeps the driver's id in
//! [`names::ANN_PV_VOLUME_ID`], and a PV whose account cannot be told fails to translate
//! (kept and reported) instead of being deleted under a made-up id.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AzureFilePersistentVolumeSource, CSIPersistentVolumeSource, PersistentVolume, SecretReference,
};

use super::params::attribute;
use super::{Plugin, go_bool};
use crate::gofmt::quote;
use crate::names;

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

/// The share a volume id names (its third `#` segment), as the driver parses it.
fn share_of(volume_id: &str) -> Option<&str> {
    volume_id.split('#').nth(2)
}

/// The id DeleteVolume must get for the in-tree source `file` of `pv`: the driver's own when the
/// PV keeps it, else upstream's rebuild when the account can be told from the secret's name.
fn volume_id(
    pv: &PersistentVolume,
    file: &AzureFilePersistentVolumeSource,
    namespace: &str,
) -> Result<String, String> {
    let annotation = |key: &str| {
        pv.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .filter(|v| !v.is_empty())
    };
    let share = &file.share_name;
    if let Some(kept) = annotation(names::ANN_PV_VOLUME_ID) {
        // Only for the share the PV names: a wrong id would delete another share.
        if share_of(kept) != Some(share.as_str()) {
            return Err(format!(
                "annotation {} {} does not name the PV's Azure File share {}; the share is kept: to delete it, set the annotation to <resource group>#<storage account>#<share>",
                names::ANN_PV_VOLUME_ID,
                quote(kept),
                quote(share),
            ));
        }
        return Ok(kept.clone());
    }
    let Some(account) = storage_account_name(&file.secret_name) else {
        // Upstream takes the secret's name for the account, and the driver then answers that
        // no such share exists: the PV goes, the share stays.
        return Err(format!(
            "cannot tell the storage account of Azure File share {}: secretName {} is not azure-storage-account-<storage account>-secret; the share is kept: to delete it, annotate the PV with {}=<resource group>#<storage account>#<share> (an empty resource group is the cluster's)",
            quote(share),
            quote(&file.secret_name),
            names::ANN_PV_VOLUME_ID,
        ));
    };
    let resource_group = annotation(RESOURCE_GROUP_ANNOTATION)
        .map(String::as_str)
        .unwrap_or_default();
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    Ok(format!(
        "{resource_group}#{account}#{share}#{name}#{namespace}"
    ))
}

pub(crate) fn to_csi(pv: &mut PersistentVolume) -> Result<(), String> {
    let spec = pv.spec.get_or_insert_default();
    let file = spec
        .azure_file
        .take()
        .ok_or_else(|| "pv is nil or Azure File source not defined on pv".to_owned())?;
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
    let volume_handle = volume_id(pv, &file, &namespace)?;
    pv.spec.get_or_insert_default().csi = Some(CSIPersistentVolumeSource {
        driver: Plugin::AzureFile.csi_name().to_owned(),
        volume_handle,
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
                quote(&csi.volume_handle)
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
    // The driver's id, for DeleteVolume: the source below cannot hold its account when the
    // secret is a node-stage secret of the class, nor its disk, namespace and subscription.
    if share_of(&csi.volume_handle) == Some(share.as_str()) {
        annotations.insert(
            names::ANN_PV_VOLUME_ID.to_owned(),
            csi.volume_handle.clone(),
        );
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
