//! Class-parameter rules several plugins share: keys matched case-insensitively, `fstype` moved
//! to `csi.storage.k8s.io/fstype`, `zone` / `zones` turned into allowed topologies.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::StorageClass;

use super::topology::{selector_terms, translate_allowed_topologies};

/// The CSI fsType parameter.
pub(crate) const CSI_FSTYPE: &str = "csi.storage.k8s.io/fstype";

/// What an in-tree parameter becomes.
pub(crate) enum Param {
    /// Copied under the given key.
    Keep(String, String),
    /// One allowed-topology zone (`zone`).
    Zone(String),
    /// Several (`zones`, split on `,` without trimming).
    Zones(Vec<String>),
    /// Dropped.
    Drop,
}

/// The class's parameters mapped one by one (in key order) by `rule`, which sees the key in
/// lower case, the original key and the value; plus the zones the `zone`/`zones` keys named.
pub(crate) fn map_params(
    sc: &StorageClass,
    rule: impl Fn(&str, &str, &str) -> Param,
) -> (BTreeMap<String, String>, Option<Vec<String>>) {
    let mut out = BTreeMap::new();
    let mut zones = None;
    for (key, value) in sc.parameters.iter().flatten() {
        match rule(&key.to_lowercase(), key, value) {
            Param::Keep(k, v) => {
                out.insert(k, v);
            }
            Param::Zone(z) => zones = Some(vec![z]),
            Param::Zones(z) => zones = Some(z),
            Param::Drop => {}
        }
    }
    (out, zones)
}

/// The rule of EBS, PD and Azure Disk for `zone` / `zones`; `fstype` renamed when `rename_fstype`.
pub(crate) fn zonal_rule(lower: &str, key: &str, value: &str, rename_fstype: bool) -> Param {
    match lower {
        "fstype" if rename_fstype => Param::Keep(CSI_FSTYPE.to_owned(), value.to_owned()),
        "zone" => Param::Zone(value.to_owned()),
        "zones" => Param::Zones(value.split(',').map(str::to_owned).collect()),
        _ => Param::Keep(key.to_owned(), value.to_owned()),
    }
}

/// Sets the translated class's allowed topologies: zones from parameters beside a non-empty
/// `allowedTopologies` are refused; otherwise the zones become one term on `csi_key`, or the
/// class's own terms get `csi_key` for their zone keys.
pub(crate) fn set_topologies(
    out: &mut StorageClass,
    zones: Option<Vec<String>>,
    csi_key: &str,
) -> Result<(), String> {
    let given = out.allowed_topologies.as_deref().unwrap_or_default();
    match zones {
        Some(_) if !given.is_empty() => {
            Err("cannot simultaneously set allowed topologies and zone/zones parameters".to_owned())
        }
        Some(zones) => {
            out.allowed_topologies = Some(selector_terms(csi_key, zones));
            Ok(())
        }
        None if !given.is_empty() => {
            out.allowed_topologies = Some(translate_allowed_topologies(given, csi_key));
            Ok(())
        }
        None => Ok(()),
    }
}

/// The copy of `sc` with `params` as its parameters.
pub(crate) fn with_params(sc: &StorageClass, params: BTreeMap<String, String>) -> StorageClass {
    let mut out = sc.clone();
    out.parameters = Some(params);
    out
}

/// A CSI volume attribute by key, case-insensitively (upstream lower-cases attribute keys).
pub(crate) fn attribute<'a>(
    attributes: Option<&'a BTreeMap<String, String>>,
    lower: &str,
) -> Option<&'a String> {
    attributes?
        .iter()
        .find(|(k, _)| k.to_lowercase() == lower)
        .map(|(_, v)| v)
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
    use k8s_openapi::api::storage::v1::StorageClass;

    /// A parameter list as the test vectors write it.
    pub(crate) type Pairs<'a> = &'a [(&'a str, &'a str)];

    /// A class with only these parameters and allowed topologies (upstream's `NewStorageClass`).
    pub(crate) fn class(
        params: &[(&str, &str)],
        topologies: Option<Vec<TopologySelectorTerm>>,
    ) -> StorageClass {
        StorageClass {
            parameters: Some(
                params
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            allowed_topologies: topologies,
            ..StorageClass::default()
        }
    }

    /// One term with one expression.
    pub(crate) fn topo(key: &str, values: &[&str]) -> Vec<TopologySelectorTerm> {
        vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: key.to_owned(),
                values: values.iter().map(|v| (*v).to_owned()).collect(),
            }]),
        }]
    }

    /// A parameter map.
    pub(crate) fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }
}
