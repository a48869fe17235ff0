//! Tests of [`super`]: terms, their order, and node affinity (built and matched).

use std::cmp::Ordering;

use super::*;
const ZONE: &str = "com.example.csi/zone";
const RACK: &str = "com.example.csi/rack";

fn t(segments: &[(&str, &str)]) -> Term {
    Term::new(segments.iter().copied())
}

#[test]
fn generate_volume_node_affinity_cases() {
    let topo = |pairs: &[(&str, &str)]| Topology {
        segments: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    };
    // "nil topology", "non-nil topology but nil segment"
    assert_eq!(volume_node_affinity(&[]), None);
    assert_eq!(volume_node_affinity(&[topo(&[])]), None);
    // "single segment"
    let pv = crate::testing::pv("p")
        .node_affinity([(ZONE, "zone1")])
        .build();
    assert_eq!(
        volume_node_affinity(&[topo(&[(ZONE, "zone1")])]),
        pv.spec.unwrap().node_affinity
    );
    // "multiple segments": expressions sorted by key, deterministic.
    let pv = crate::testing::pv("p")
        .node_affinity([(RACK, "rack2"), (ZONE, "zone1")])
        .build();
    assert_eq!(
        volume_node_affinity(&[topo(&[(ZONE, "zone1"), (RACK, "rack2")])]),
        pv.spec.unwrap().node_affinity
    );
    // "multiple topologies": one term each, in the driver's order.
    let pv = crate::testing::pv("p")
        .node_affinity([(ZONE, "zone1")])
        .node_affinity([(ZONE, "zone2")])
        .build();
    assert_eq!(
        volume_node_affinity(&[topo(&[(ZONE, "zone1")]), topo(&[(ZONE, "zone2")])]),
        pv.spec.unwrap().node_affinity
    );
}

#[test]
fn topology_term_sort() {
    // "empty", "single-key", "multiple-keys", "multiple-values"
    assert_eq!(Term::new(Vec::<(String, String)>::new()).segments(), &[]);
    assert_eq!(
        t(&[("zone", "z1")]).segments(),
        t(&[("zone", "z1")]).segments()
    );
    assert_eq!(
        t(&[("zone", "z1"), ("rack", "r1"), ("host", "h1")]).segments()[0].0,
        "host"
    );
    assert_eq!(
        t(&[("zone", "z2"), ("zone", "z1")]).segments(),
        &[
            ("zone".to_owned(), "z1".to_owned()),
            ("zone".to_owned(), "z2".to_owned())
        ]
    );
}

#[test]
fn topology_term_compare() {
    // "shorter", "key-smaller", "value-smaller"
    assert_eq!(
        t(&[("zone", "z1")]).compare(&t(&[("rack", "r1"), ("zone", "z1")])),
        Ordering::Less
    );
    assert_eq!(
        t(&[("a", "z9")]).compare(&t(&[("b", "a1")])),
        Ordering::Less
    );
    assert_eq!(
        t(&[("zone", "z1")]).compare(&t(&[("zone", "z2")])),
        Ordering::Less
    );
    assert_eq!(
        t(&[("zone", "z1")]).compare(&t(&[("zone", "z1")])),
        Ordering::Equal
    );
}

#[test]
fn topology_term_subset() {
    let zone = t(&[("zone", "z1")]);
    let zone_rack = t(&[("rack", "r1"), ("zone", "z1")]);
    let host_rack_zone = t(&[("host", "h1"), ("rack", "r1"), ("zone", "z1")]);
    // "empty"
    assert!(Term::default().is_subset_of(&zone));
    // "shorter", "longer"
    assert!(zone.is_subset_of(&zone_rack));
    assert!(!zone_rack.is_subset_of(&zone));
    // "same"
    assert!(zone_rack.is_subset_of(&zone_rack));
    // "shorter-2", "longer-2", "shorter-3", "longer-3"
    assert!(t(&[("rack", "r1")]).is_subset_of(&zone_rack));
    assert!(zone_rack.is_subset_of(&host_rack_zone));
    assert!(!host_rack_zone.is_subset_of(&zone_rack));
    assert!(t(&[("host", "h1"), ("zone", "z1")]).is_subset_of(&host_rack_zone));
    // "unrelated"
    assert!(!t(&[("zone", "z2")]).is_subset_of(&zone_rack));
    assert!(!t(&[("region", "x")]).is_subset_of(&zone_rack));
}

#[test]
fn node_mode_accessibility_follows_node_selector_semantics() {
    let segments: HashMap<String, String> = [(ZONE.to_owned(), "zone1".to_owned())]
        .into_iter()
        .collect();
    let affinity = |pv: crate::testing::PvBuilder| pv.build().spec.unwrap().node_affinity;
    let here = affinity(crate::testing::pv("p").node_affinity([(ZONE, "zone1")]));
    let there = affinity(crate::testing::pv("p").node_affinity([(ZONE, "zone2")]));
    let either = affinity(
        crate::testing::pv("p")
            .node_affinity([(ZONE, "zone2")])
            .node_affinity([(ZONE, "zone1")]),
    );
    assert_eq!(
        volume_is_accessible(here.as_ref(), Some(&segments)),
        Ok(true)
    );
    assert_eq!(
        volume_is_accessible(there.as_ref(), Some(&segments)),
        Ok(false)
    );
    assert_eq!(
        volume_is_accessible(either.as_ref(), Some(&segments)),
        Ok(true)
    );
    // No affinity, or a driver without topology: every instance may delete it.
    assert_eq!(volume_is_accessible(None, Some(&segments)), Ok(true));
    assert_eq!(volume_is_accessible(there.as_ref(), None), Ok(true));

    let req = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
        key: key.to_owned(),
        operator: op.to_owned(),
        values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
    };
    let with = |exprs: Vec<NodeSelectorRequirement>| VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(exprs),
                match_fields: None,
            }],
        }),
    };
    let check = |a: VolumeNodeAffinity| volume_is_accessible(Some(&a), Some(&segments));
    assert_eq!(check(with(vec![req(ZONE, "NotIn", &["zone2"])])), Ok(true));
    assert_eq!(check(with(vec![req(ZONE, "Exists", &[])])), Ok(true));
    assert_eq!(check(with(vec![req(RACK, "DoesNotExist", &[])])), Ok(true));
    assert_eq!(
        check(with(vec![
            req(ZONE, "In", &["zone1"]),
            req(RACK, "Exists", &[])
        ])),
        Ok(false)
    );
    assert!(check(with(vec![req(ZONE, "Near", &["zone1"])])).is_err());
    assert!(check(with(vec![])).is_ok_and(|ok| !ok));
}
