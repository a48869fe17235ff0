//! AWS EBS: `kubernetes.io/aws-ebs` <-> `ebs.csi.aws.com`, zones under
//! `topology.ebs.csi.aws.com/zone`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::params::{map_params, set_topologies, with_params, zonal_rule};
use super::topology::{aws_region, csi_to_in_tree, in_tree_to_csi};
use super::{Plugin, go_bool, go_string, topology_error};

/// The driver's zone key.
pub(crate) const ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";

/// `fstype` renamed, `zone` / `zones` to allowed topologies, and `iopsPerGB` kept with
/// `allowautoiopspergbincrease: "true"` beside it.
pub(crate) fn translate_class(sc: &StorageClass) -> Result<StorageClass, String> {
    let (mut params, zones) =
        map_params(sc, |lower, key, value| zonal_rule(lower, key, value, true));
    if params.keys().any(|k| k.to_lowercase() == "iopspergb") {
        params.insert("allowautoiopspergbincrease".to_owned(), "true".to_owned());
    }
    let mut out = with_params(sc, params);
    set_topologies(&mut out, zones, ZONE_KEY)?;
    Ok(out)
}

/// The EBS volume id of a Kubernetes volume id: `aws://<zone>/vol-x` or `aws:///vol-x` give
/// `vol-x`; anything not starting with `aws://` is taken as it is.
pub(crate) fn ebs_volume_id(id: &str) -> Result<String, String> {
    let Some(rest) = id.strip_prefix("aws://") else {
        return Ok(id.to_owned());
    };
    let path = rest
        .find('/')
        .map_or("", |at| &rest[at..])
        .trim_matches('/');
    if path.starts_with("vol-") && !path.contains('/') {
        Ok(path.to_owned())
    } else {
        Err(format!("Invalid format for AWS volume ({id})"))
    }
}

pub(crate) fn to_csi(pv: &mut PersistentVolume) -> Result<(), String> {
    let spec = pv.spec.get_or_insert_default();
    let ebs = spec
        .aws_elastic_block_store
        .take()
        .ok_or_else(|| "pv is nil or AWS EBS not defined on pv".to_owned())?;
    let handle = ebs_volume_id(&ebs.volume_id)
        .map_err(|e| format!("failed to translate Kubernetes ID to EBS Volume ID {e}"))?;
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: Plugin::AwsEbs.csi_name().to_owned(),
        volume_handle: handle,
        read_only: go_bool(ebs.read_only),
        fs_type: go_string(ebs.fs_type),
        volume_attributes: Some(BTreeMap::from([(
            "partition".to_owned(),
            ebs.partition.unwrap_or(0).to_string(),
        )])),
        ..CSIPersistentVolumeSource::default()
    });
    in_tree_to_csi(pv, ZONE_KEY);
    Ok(())
}

pub(crate) fn to_in_tree(
    pv: &mut PersistentVolume,
    csi: CSIPersistentVolumeSource,
) -> Result<(), String> {
    let partition = match csi.volume_attributes.as_ref().and_then(|a| a.get("partition")) {
        Some(p) => Some(p.parse::<i32>().map_err(|_| {
            format!(
                "failed to convert partition {p} to integer: strconv.Atoi: parsing {}: invalid syntax",
                crate::gofmt::quote(p)
            )
        })?),
        None => None,
    };
    pv.spec.get_or_insert_default().aws_elastic_block_store =
        Some(AWSElasticBlockStoreVolumeSource {
            volume_id: csi.volume_handle,
            fs_type: go_string(csi.fs_type),
            read_only: go_bool(csi.read_only),
            partition: partition.filter(|p| *p != 0),
        });
    csi_to_in_tree(pv, ZONE_KEY, Some(aws_region)).map_err(|e| topology_error(pv, &e))
}

#[cfg(test)]
#[path = "aws_ebs_tests.rs"]
mod tests;
