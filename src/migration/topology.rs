//! Topology rules shared by the translations of the in-tree plugins: zone keys in a class's
//! allowed topologies and a PV's node affinity moved between Kubernetes' zone labels and a
//! driver's own key, zone and region labels added to a PV written back in in-tree form, and the
//! regions of AWS and GCE zones. Upstream's csi-translation-lib is the reference for behaviour.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    TopologySelectorLabelRequirement, TopologySelectorTerm, VolumeNodeAffinity,
};

/// The GA zone label.
pub(crate) const GA_ZONE: &str = "topology.kubernetes.io/zone";
/// The GA region label.
pub(crate) const GA_REGION: &str = "topology.kubernetes.io/region";
/// The beta zone label.
pub(crate) const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
/// The beta region label.
pub(crate) const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
/// Several zones in one label value are joined with this.
pub(crate) const ZONES_DELIMITER: &str = "__";

/// One allowed-topology term with one expression `key In values` (values as given).
pub(crate) fn selector_terms(key: &str, values: Vec<String>) -> Vec<TopologySelectorTerm> {
    vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
            key: key.to_owned(),
            values,
        }]),
    }]
}

/// Drops from each term of `affinity` a region requirement (beta or GA label, `In`) that the
/// term's zone implies: every value of an `In` requirement on a key the driver reports
/// (`reported`) starts with one of the region's values, as AWS, GCE and zonal Azure zones name
/// their region (`us-central1-b` in `us-central1`). Nothing else changes: a region without such a
/// zone beside it still has to match.
pub(crate) fn drop_implied_regions(
    affinity: &mut VolumeNodeAffinity,
    reported: impl Fn(&str) -> bool,
) {
    let terms = affinity
        .required
        .as_mut()
        .map(|r| &mut r.node_selector_terms);
    for exprs in terms
        .into_iter()
        .flatten()
        .filter_map(|t| t.match_expressions.as_mut())
    {
        let zones: Vec<String> = exprs
            .iter()
            .filter(|e| e.operator == "In" && reported(&e.key))
            .flat_map(|e| e.values.clone().unwrap_or_default())
            .collect();
        let implied = |e: &NodeSelectorRequirement| {
            let regions = e.values.as_deref().unwrap_or_default();
            [GA_REGION, BETA_REGION].contains(&e.key.as_str())
                && e.operator == "In"
                && !zones.is_empty()
                && zones
                    .iter()
                    .all(|z| regions.iter().any(|r| z.starts_with(r.as_str())))
        };
        exprs.retain(|e| !implied(e));
    }
}

/// The class's allowed topologies with every beta or GA zone key replaced by `csi_key`; other
/// expressions (regions included) are kept as they are.
pub(crate) fn translate_allowed_topologies(
    terms: &[TopologySelectorTerm],
    csi_key: &str,
) -> Vec<TopologySelectorTerm> {
    terms
        .iter()
        .map(|term| TopologySelectorTerm {
            match_label_expressions: term.match_label_expressions.as_ref().map(|exprs| {
                exprs
                    .iter()
                    .map(|e| TopologySelectorLabelRequirement {
                        key: if e.key == BETA_ZONE || e.key == GA_ZONE {
                            csi_key.to_owned()
                        } else {
                            e.key.clone()
                        },
                        values: e.values.clone(),
                    })
                    .collect()
            }),
        })
        .collect()
}

fn terms_mut(pv: &mut PersistentVolume) -> Option<&mut Vec<NodeSelectorTerm>> {
    let terms = &mut pv
        .spec
        .as_mut()?
        .node_affinity
        .as_mut()?
        .required
        .as_mut()?
        .node_selector_terms;
    (!terms.is_empty()).then_some(terms)
}

fn terms(pv: &PersistentVolume) -> &[NodeSelectorTerm] {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map_or(&[], |r| r.node_selector_terms.as_slice())
}

/// Renames every node-affinity expression keyed `old` to `new` (values kept; nothing merged).
pub(crate) fn replace_topology(pv: &mut PersistentVolume, old: &str, new: &str) {
    if let Some(terms) = terms_mut(pv) {
        for term in terms {
            for e in term.match_expressions.iter_mut().flatten() {
                if e.key == old {
                    e.key = new.to_owned();
                }
            }
        }
    }
}

/// Every value of every node-affinity expression keyed `key`, deduplicated and sorted.
pub(crate) fn topology_values(pv: &PersistentVolume, key: &str) -> Vec<String> {
    let values: BTreeSet<String> = terms(pv)
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == key)
        .flat_map(|e| e.values.iter().flatten().cloned())
        .collect();
    values.into_iter().collect()
}

/// Whether any node-affinity expression is keyed `key`.
pub(crate) fn has_topology_key(pv: &PersistentVolume, key: &str) -> bool {
    terms(pv)
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .any(|e| e.key == key)
}

/// Appends `key In zones` (trimmed, without empties, deduplicated, sorted) to every term of the
/// PV's node affinity, creating one term when there is none; an error when no zone is left.
pub(crate) fn add_topology(
    pv: &mut PersistentVolume,
    key: &str,
    zones: &[String],
) -> Result<(), String> {
    let zones: BTreeSet<String> = zones
        .iter()
        .map(|z| z.trim().to_owned())
        .filter(|z| !z.is_empty())
        .collect();
    if zones.is_empty() {
        return Err("there are no valid zones to add to pv".to_owned());
    }
    let expression = NodeSelectorRequirement {
        key: key.to_owned(),
        operator: "In".to_owned(),
        values: Some(zones.into_iter().collect()),
    };
    let spec = pv.spec.get_or_insert_default();
    let affinity = spec
        .node_affinity
        .get_or_insert_with(VolumeNodeAffinity::default);
    let required = affinity.required.get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_default()
            .push(expression.clone());
    }
    Ok(())
}

fn label<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a String> {
    pv.metadata.labels.as_ref()?.get(key)
}

/// Which zone and region labels a PV uses: GA or beta, by its node affinity first, then its
/// labels, GA by default.
pub(crate) fn topology_labels(pv: &PersistentVolume) -> (&'static str, &'static str) {
    if has_topology_key(pv, GA_ZONE) {
        (GA_ZONE, GA_REGION)
    } else if has_topology_key(pv, BETA_ZONE) {
        (BETA_ZONE, BETA_REGION)
    } else if label(pv, GA_ZONE).is_some() {
        (GA_ZONE, GA_REGION)
    } else if label(pv, BETA_ZONE).is_some() {
        (BETA_ZONE, BETA_REGION)
    } else {
        (GA_ZONE, GA_REGION)
    }
}

/// In-tree PV to CSI: the zone key of the affinity becomes `csi_key` (or, without one, the zone
/// label becomes an affinity on `csi_key`); a beta region key becomes the GA one. Labels stay.
pub(crate) fn in_tree_to_csi(pv: &mut PersistentVolume, csi_key: &str) {
    let (zone_label, region_label) = topology_labels(pv);
    if !topology_values(pv, zone_label).is_empty() {
        replace_topology(pv, zone_label, csi_key);
    } else if let Some(zones) = label(pv, zone_label).cloned() {
        let zones: Vec<String> = zones.split(ZONES_DELIMITER).map(str::to_owned).collect();
        // Upstream ignores a label without a usable zone.
        let _ = add_topology(pv, csi_key, &zones);
    }
    if region_label == BETA_REGION && !topology_values(pv, BETA_REGION).is_empty() {
        replace_topology(pv, BETA_REGION, GA_REGION);
    }
}

/// The region of a set of zones (AWS's or GCE's rule).
pub(crate) type RegionParser = fn(&[String]) -> Result<String, String>;

/// CSI PV to in-tree: `csi_key` becomes the zone label key; with a region parser each term gets
/// its region expression (unless it has one), and the PV the region label when there is exactly
/// one; the zone label is set (the zones joined) when absent. Labels are only ever added.
pub(crate) fn csi_to_in_tree(
    pv: &mut PersistentVolume,
    csi_key: &str,
    region: Option<RegionParser>,
) -> Result<(), String> {
    let (zone_label, _) = topology_labels(pv);
    replace_topology(pv, csi_key, zone_label);
    if let Some(parse) = region {
        add_regions(pv, parse)
            .map_err(|e| format!("Failed to handle region topology. error: {e}"))?;
    }
    let (zone_label, _) = topology_labels(pv);
    let zones = topology_values(pv, zone_label);
    if !zones.is_empty() && label(pv, zone_label).is_none() {
        pv.metadata
            .labels
            .get_or_insert_default()
            .insert(zone_label.to_owned(), zones.join(ZONES_DELIMITER));
    }
    Ok(())
}

fn add_regions(pv: &mut PersistentVolume, parse: RegionParser) -> Result<(), String> {
    let (zone_label, region_label) = topology_labels(pv);
    let Some(terms) = terms_mut(pv) else {
        return Ok(());
    };
    for term in terms {
        let exprs = term.match_expressions.get_or_insert_default();
        if exprs.iter().any(|e| e.key == region_label) {
            continue;
        }
        let zones: Vec<String> = exprs
            .iter()
            .filter(|e| e.key == zone_label)
            .flat_map(|e| e.values.iter().flatten().cloned())
            .collect();
        let region = parse(&zones)?;
        exprs.push(NodeSelectorRequirement {
            key: region_label.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![region]),
        });
    }
    let regions = topology_values(pv, region_label);
    if let [one] = regions.as_slice()
        && label(pv, region_label).is_none()
    {
        pv.metadata
            .labels
            .get_or_insert_default()
            .insert(region_label.to_owned(), one.clone());
    }
    Ok(())
}

/// Go's `%v` of a string set (`map[a:{} b:{}]`), as upstream's region errors print it.
fn go_set(set: &BTreeSet<String>) -> String {
    let items: Vec<String> = set.iter().map(|s| format!("{s}:{{}}")).collect();
    format!("map[{}]", items.join(" "))
}

/// The one region of `zones`, `region` telling each zone's.
fn single_region(
    zones: &[String],
    region: impl Fn(&str) -> Result<String, String>,
) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".to_owned());
    }
    let regions = zones
        .iter()
        .map(|z| region(z))
        .collect::<Result<BTreeSet<String>, String>>()?;
    if regions.len() == 1 {
        Ok(regions.into_iter().next().unwrap_or_default())
    } else {
        Err(format!(
            "multiple or no regions gotten from zones, got: {}",
            go_set(&regions)
        ))
    }
}

/// GCE: `{locale}-{region}-{zone}` zones, one region.
pub(crate) fn gce_region(zones: &[String]) -> Result<String, String> {
    single_region(
        zones,
        |zone| match zone.split('-').collect::<Vec<_>>()[..] {
            [locale, region, _] => Ok(format!("{locale}-{region}")),
            _ => Err(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            )),
        },
    )
}

/// AWS: `us-west-2a` (also GovCloud), local zones `us-west-2-lax-1a` and wavelength zones
/// `us-east-1-wl1-bos-wlz-1`, one region.
pub(crate) fn aws_region(zones: &[String]) -> Result<String, String> {
    single_region(zones, |zone| {
        let parts: Vec<&str> = zone.split('-').collect();
        let last = parts.last().copied().unwrap_or_default();
        if (parts.len() == 3 || parts.len() == 4) && last.len() == 2 {
            // Go's `zone[:len(zone)-1]` drops one byte; a wider last character would split
            // (and panic here), so its leftover byte reads as U+FFFD.
            Ok(String::from_utf8_lossy(&zone.as_bytes()[..zone.len() - 1]).into_owned())
        } else if parts.len() == 5 || parts.len() == 7 {
            Ok(parts[..3].join("-"))
        } else {
            Err(format!(
                "Unexpected zone format: {zone} is not a valid AWS zone"
            ))
        }
    })
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
