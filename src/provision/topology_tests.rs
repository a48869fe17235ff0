//! Tests of `topology`, mirroring upstream `topology_test.go` case names where they apply.

use super::*;
use crate::testing::{csinode, node, topology_term};

const DRIVER: &str = "com.example.csi/test-driver";
const ZONE: &str = "com.example.csi/zone";
const RACK: &str = "com.example.csi/rack";

/// Nodes `node-0`, `node-1`, ... with the given labels (plus another driver's label), and
/// CSINodes registering our driver with the given keys (`None`: our driver is not on the
/// node) next to another driver, as upstream's fixtures do.
fn cluster(labels: &[&[(&str, &str)]], keys: &[Option<&[&str]>]) -> StaticTopology {
    let nodes = labels
        .iter()
        .enumerate()
        .map(|(i, l)| {
            Arc::new(
                node(&format!("node-{i}"))
                    .labels(l.iter().copied())
                    .label("net.example.storage/rack", "rack1")
                    .build(),
            )
        })
        .collect();
    let csinodes = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let name = format!("node-{i}");
            let mut b = csinode(&name).driver(
                "net.example.storage/other-driver",
                &name,
                ["net.example.storage/rack"],
            );
            if let Some(k) = k {
                b = b.driver(DRIVER, &name, k.iter().copied());
            }
            Arc::new(b.build())
        })
        .collect();
    StaticTopology { csinodes, nodes }
}

fn params<'a>(
    allowed: &'a [TopologySelectorTerm],
    selected: Option<&'a str>,
    strict: bool,
    immediate: bool,
) -> TopologyParams<'a> {
    TopologyParams {
        driver: DRIVER,
        claim_name: "testpvc",
        allowed_topologies: allowed,
        selected_node: selected,
        strict,
        immediate,
    }
}

fn t(segments: &[(&str, &str)]) -> Term {
    Term::new(segments.iter().copied())
}

fn requisite(
    p: &TopologyParams<'_>,
    view: &StaticTopology,
) -> Result<Option<Vec<Term>>, TopologyError> {
    requirement_terms(p, view).map(|r| r.map(|(req, _)| req))
}

fn preferred(
    p: &TopologyParams<'_>,
    view: &StaticTopology,
) -> Result<Option<Vec<Term>>, TopologyError> {
    requirement_terms(p, view).map(|r| r.map(|(_, pref)| pref))
}

#[test]
fn allowed_topologies_cases() {
    let z = |v: Vec<&'static str>| (ZONE, v);
    let r = |v: Vec<&'static str>| (RACK, v);
    let cases: Vec<(&str, Vec<TopologySelectorTerm>, Vec<Term>)> = vec![
        (
            "single expression, single value",
            vec![topology_term([z(vec!["zone1"])])],
            vec![t(&[(ZONE, "zone1")])],
        ),
        (
            "single expression, multiple values",
            vec![topology_term([z(vec!["zone1", "zone2"])])],
            vec![t(&[(ZONE, "zone1")]), t(&[(ZONE, "zone2")])],
        ),
        (
            "multiple expressions, single value",
            vec![topology_term([z(vec!["zone1"]), r(vec!["rackA"])])],
            vec![t(&[(ZONE, "zone1"), (RACK, "rackA")])],
        ),
        (
            "multiple expressions, 1 single value, 1 multiple values",
            vec![topology_term([z(vec!["zone1"]), r(vec!["rackA", "rackB"])])],
            vec![
                t(&[(ZONE, "zone1"), (RACK, "rackA")]),
                t(&[(ZONE, "zone1"), (RACK, "rackB")]),
            ],
        ),
        (
            "multiple expressions, both multiple values",
            vec![topology_term([
                z(vec!["zone1", "zone2"]),
                r(vec!["rackA", "rackB"]),
            ])],
            vec![
                t(&[(ZONE, "zone1"), (RACK, "rackA")]),
                t(&[(ZONE, "zone2"), (RACK, "rackA")]),
                t(&[(ZONE, "zone1"), (RACK, "rackB")]),
                t(&[(ZONE, "zone2"), (RACK, "rackB")]),
            ],
        ),
        (
            "multiple terms: single expression, single values",
            vec![
                topology_term([z(vec!["zone1"])]),
                topology_term([r(vec!["rackA"])]),
            ],
            vec![t(&[(RACK, "rackA")]), t(&[(ZONE, "zone1")])],
        ),
        (
            "multiple terms: single expression, overlapping keys, distinct values",
            vec![
                topology_term([z(vec!["zone1"])]),
                topology_term([z(vec!["zone2"])]),
            ],
            vec![t(&[(ZONE, "zone1")]), t(&[(ZONE, "zone2")])],
        ),
        (
            "multiple terms: single expression, overlapping keys, overlapping values",
            vec![
                topology_term([z(vec!["zone1", "zone2"])]),
                topology_term([z(vec!["zone2", "zone3"])]),
            ],
            vec![
                t(&[(ZONE, "zone1")]),
                t(&[(ZONE, "zone2")]),
                t(&[(ZONE, "zone3")]),
            ],
        ),
        (
            "multiple terms: 1 single expression, 1 multiple expressions; contains a subset duplicate",
            vec![
                topology_term([z(vec!["zone1"])]),
                topology_term([z(vec!["zone1", "zone2"]), r(vec!["rackA", "rackB"])]),
            ],
            vec![
                t(&[(ZONE, "zone1")]),
                t(&[(ZONE, "zone1"), (RACK, "rackA")]),
                t(&[(ZONE, "zone2"), (RACK, "rackA")]),
                t(&[(ZONE, "zone1"), (RACK, "rackB")]),
                t(&[(ZONE, "zone2"), (RACK, "rackB")]),
            ],
        ),
        (
            "multiple terms: both contains multiple expressions; contains an identical duplicate",
            vec![
                topology_term([z(vec!["zone1"]), r(vec!["rackB"])]),
                topology_term([z(vec!["zone1", "zone2"]), r(vec!["rackA", "rackB"])]),
            ],
            vec![
                t(&[(ZONE, "zone1"), (RACK, "rackA")]),
                t(&[(ZONE, "zone2"), (RACK, "rackA")]),
                t(&[(ZONE, "zone1"), (RACK, "rackB")]),
                t(&[(ZONE, "zone2"), (RACK, "rackB")]),
            ],
        ),
    ];
    let view = StaticTopology::default();
    for (name, allowed, want) in cases {
        // Immediate binding: allowedTopologies alone decide the requisite, sorted and deduped.
        let got = requisite(&params(&allowed, None, false, false), &view).unwrap();
        assert_eq!(got, Some(want), "case {name:?}");
    }
}

#[test]
fn topology_aggregation_cases() {
    let z1: &[(&str, &str)] = &[(ZONE, "zone1")];
    let z2: &[(&str, &str)] = &[(ZONE, "zone2")];
    let z3: &[(&str, &str)] = &[(ZONE, "zone3")];
    let zone: Option<&[&str]> = Some(&[ZONE]);
    let zone_rack: Option<&[&str]> = Some(&[ZONE, RACK]);
    let no_keys: Option<&[&str]> = Some(&[]);
    type Case<'a> = (
        &'a str,
        Vec<&'a [(&'a str, &'a str)]>,
        Vec<Option<&'a [&'a str]>>,
        bool,
        Result<Vec<Term>, ()>,
    );
    let cases: Vec<Case> = vec![
        (
            "same keys and values across cluster",
            vec![z1, z1, z1],
            vec![zone, zone, zone],
            false,
            Ok(vec![t(z1)]),
        ),
        (
            "selected node; same keys and values across cluster",
            vec![z1, z1, z1],
            vec![zone, zone, zone],
            true,
            Ok(vec![t(z1)]),
        ),
        (
            "different values across cluster",
            vec![z1, z2, z2],
            vec![zone, zone, zone],
            false,
            Ok(vec![t(z1), t(z2)]),
        ),
        (
            "selected node; different values across cluster",
            vec![z1, z2, z2],
            vec![zone, zone, zone],
            true,
            Ok(vec![t(z1), t(z2)]),
        ),
        (
            "selected node: different keys across cluster",
            vec![
                z1,
                &[(ZONE, "zone1"), (RACK, "rackA")],
                &[(ZONE, "zone1"), (RACK, "rackA")],
            ],
            vec![zone, zone_rack, zone_rack],
            true,
            Ok(vec![t(z1)]),
        ),
        (
            "random node: no nodes",
            vec![],
            vec![zone, zone, zone],
            false,
            Err(()),
        ),
        (
            "random node: missing matching node info",
            vec![&[("com.example.another/zone", "zone1")], &[], &[]],
            vec![zone, zone, zone],
            false,
            Err(()),
        ),
        (
            "random node: no CSINodes",
            vec![z1, z2, z2],
            vec![],
            false,
            Err(()),
        ),
        (
            "random node: missing keys",
            vec![z1, z2, z2],
            vec![no_keys, no_keys, no_keys],
            false,
            Err(()),
        ),
        (
            "random node: one node has been upgraded",
            vec![
                &[("com.example.another/zone", "zone1")],
                &[("com.example.another/zone", "zone2")],
                z3,
            ],
            vec![no_keys, no_keys, zone],
            false,
            Ok(vec![t(z3)]),
        ),
        (
            "random node: node labels already exist without CSINode",
            vec![z1, z2, z3],
            vec![no_keys, no_keys, zone],
            false,
            Ok(vec![t(z1), t(z2), t(z3)]),
        ),
        (
            "selected node: missing matching node info",
            vec![&[("com.example.another/zone", "zone1")], z1, z1],
            vec![zone, zone, zone],
            true,
            Err(()),
        ),
        (
            "selected node: no CSINode info",
            vec![z1, z1, z1],
            vec![],
            true,
            Err(()),
        ),
        (
            "selected node is missing keys",
            vec![z1, z1, z1],
            vec![no_keys, no_keys, no_keys],
            true,
            Err(()),
        ),
    ];
    for (name, labels, keys, has_selected, want) in cases {
        let view = cluster(&labels, &keys);
        let selected = has_selected.then_some("node-0");
        for strict in [false, true] {
            let p = params(&[], selected, strict, true);
            let got = requisite(&p, &view).map_err(|_| ());
            let want = match (&want, strict && has_selected) {
                // Strict topology sends only the selected node's term.
                (Ok(_), true) => Ok(Some(vec![t(labels[0])])),
                (Ok(v), false) => Ok(Some(v.clone())),
                (Err(()), _) => Err(()),
            };
            assert_eq!(got, want, "case {name:?} strict={strict}");
        }
    }
}

#[test]
fn preferred_topologies_cases() {
    let za_ra: &[(&str, &str)] = &[(ZONE, "zone2"), (RACK, "rackA")];
    let z1_ra: &[(&str, &str)] = &[(ZONE, "zone1"), (RACK, "rackA")];
    let z1_rb: &[(&str, &str)] = &[(ZONE, "zone1"), (RACK, "rackB")];
    let keys: Option<&[&str]> = Some(&[ZONE, RACK]);
    let allowed = vec![topology_term([
        (ZONE, vec!["zone1", "zone2"]),
        (RACK, vec!["rackA", "rackB"]),
    ])];
    let view = cluster(&[za_ra, z1_ra, z1_rb], &[keys, keys, keys]);

    // "allowedTopologies specified": rotated to the selected node's term.
    assert_eq!(
        preferred(&params(&allowed, Some("node-0"), false, true), &view).unwrap(),
        Some(vec![
            t(za_ra),
            t(z1_rb),
            t(&[(ZONE, "zone2"), (RACK, "rackB")]),
            t(z1_ra),
        ])
    );
    // "allowedTopologies specified: no CSINode"
    let no_csinode = cluster(&[za_ra, z1_ra, z1_rb], &[]);
    assert_eq!(
        requirement_terms(&params(&allowed, Some("node-0"), false, true), &no_csinode),
        Err(TopologyError::SelectedCsiNodeNotFound {
            node: "node-0".to_owned()
        })
    );
    // "allowedTopologies specified: mismatched key"
    let other_key = cluster(
        &[&[("com.example.csi/zone-other", "zone2"), (RACK, "rackA")]],
        &[Some(&["com.example.csi/zone-other", RACK])],
    );
    assert!(matches!(
        requirement_terms(&params(&allowed, Some("node-0"), false, true), &other_key),
        Err(TopologyError::NotInRequisite { .. })
    ));
    // "topology aggregation"
    assert_eq!(
        preferred(&params(&[], Some("node-0"), false, true), &view).unwrap(),
        Some(vec![t(za_ra), t(z1_rb), t(z1_ra)])
    );
    // "topology aggregation with no topology info"
    let empty = cluster(&[&[], &[], &[]], &[Some(&[]), Some(&[]), Some(&[])]);
    assert!(matches!(
        requirement_terms(&params(&[], Some("node-0"), false, true), &empty),
        Err(TopologyError::NoTopologyKeys {
            driver_registered: true,
            ..
        })
    ));
    // "topology from selected node is not in allowedTopologies"
    let zone_only = vec![topology_term([(ZONE, vec!["zone1"])])];
    let zones = cluster(
        &[&[(ZONE, "zone2")], &[(ZONE, "zone1")], &[(ZONE, "zone1")]],
        &[Some(&[ZONE]), Some(&[ZONE]), Some(&[ZONE])],
    );
    let err =
        requirement_terms(&params(&zone_only, Some("node-0"), false, true), &zones).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"topology [{com.example.csi/zone zone2}] from selected node "node-0" is not in requisite: [[{com.example.csi/zone zone1}]]"#
    );
    let err =
        requirement_terms(&params(&zone_only, Some("node-0"), true, true), &zones).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"selected node '"node-0"' topology '[{com.example.csi/zone zone2}]' is not in allowed topologies: [[{com.example.csi/zone zone1}]]"#
    );
    // "allowedTopologies is subset of selected node's topology"
    let subset = vec![topology_term([(ZONE, vec!["zone2"])])];
    assert_eq!(
        requirement_terms(&params(&subset, Some("node-0"), true, true), &view).unwrap(),
        Some((vec![t(za_ra)], vec![t(za_ra)]))
    );
    // "allowedTopologies is not the subset of selected node's topology"
    let not_subset = vec![topology_term([(ZONE, vec!["zone1"])])];
    assert!(matches!(
        requirement_terms(&params(&not_subset, Some("node-0"), true, true), &view),
        Err(TopologyError::NotInAllowedTopologies { .. })
    ));
}

#[test]
fn statefulset_replicas_spread_over_terms() {
    let labels: Vec<&[(&str, &str)]> = vec![
        &[(ZONE, "zone1"), (RACK, "rackA")],
        &[(ZONE, "zone2"), (RACK, "rackB")],
        &[(ZONE, "zone3"), (RACK, "rackC")],
        &[(ZONE, "zone4"), (RACK, "rackD")],
    ];
    let keys: Option<&[&str]> = Some(&[ZONE, RACK]);
    let view = cluster(&labels, &[keys, keys, keys, keys]);
    let first = |name: &str, allowed: &[TopologySelectorTerm], immediate: bool| {
        let p = TopologyParams {
            claim_name: name,
            ..params(allowed, None, false, immediate)
        };
        requirement_terms(&p, &view)
            .unwrap()
            .map(|(_, pref)| pref[0].clone())
    };
    // Upstream's expectations: the claim-name part is ignored, the ordinal shifts the start.
    let term = |i: usize| Some(t(labels[i]));
    assert_eq!(first("testpvcA-testset-1", &[], true), term(0));
    assert_eq!(first("testpvcB-testset-1", &[], true), term(0));
    assert_eq!(first("testset-2", &[], true), term(1));
    assert_eq!(first("testpvc-testset-3", &[], true), term(2));
    assert_eq!(first("testpvc-testset-4", &[], true), term(3));
    // Without --immediate-topology and allowedTopologies there is no requirement at all.
    assert_eq!(first("testpvc-testset-4", &[], false), None);
    let single = vec![topology_term([
        (ZONE, vec!["zone1"]),
        (RACK, vec!["rackA"]),
    ])];
    assert_eq!(first("testpvcC-testset-1", &single, false), term(0));
    let two = vec![
        topology_term([(ZONE, vec!["zone2"]), (RACK, vec!["rackB"])]),
        topology_term([(ZONE, vec!["zone1"]), (RACK, vec!["rackA"])]),
    ];
    assert_eq!(first("testpvcB-testset-2", &two, false), term(1));
}

#[test]
fn statefulset_name_parsing_and_fnv1() {
    // FNV-1 (not 1a) reference values.
    assert_eq!(fnv1_32(b""), 0x811c_9dc5);
    assert_eq!(fnv1_32(b"a"), 0x050c_5d7e);
    assert_eq!(fnv1_32(b"foobar"), 0x31f0_b262);
    assert_eq!(
        claim_name_hash_and_index("claim-set-3"),
        (fnv1_32(b"set"), 3)
    );
    assert_eq!(claim_name_hash_and_index("set-3"), (fnv1_32(b"set"), 3));
    assert_eq!(claim_name_hash_and_index("data"), (fnv1_32(b"data"), 0));
    assert_eq!(claim_name_hash_and_index("data-x"), (fnv1_32(b"data-x"), 0));
    assert_eq!(
        claim_name_hash_and_index("data-+1"),
        (fnv1_32(b"data-+1"), 0)
    );
    assert_eq!(
        claim_name_hash_and_index("data-4294967296"),
        (fnv1_32(b"data-4294967296"), 0)
    );
}

#[test]
fn immediate_topology_off_sends_no_requirement_without_allowed_topologies() {
    let view = cluster(&[&[(ZONE, "zone1")]], &[Some(&[ZONE])]);
    assert_eq!(
        generate_accessibility_requirements(&params(&[], None, false, false), &view).unwrap(),
        None
    );
    let req = generate_accessibility_requirements(&params(&[], None, false, true), &view)
        .unwrap()
        .unwrap();
    assert_eq!(req.requisite.len(), 1);
    assert_eq!(req.requisite[0].segments[ZONE], "zone1");
    assert_eq!(req.preferred, req.requisite);
}

#[test]
fn immediate_binding_without_registered_keys_reports_no_available_topology() {
    let view = cluster(&[&[(ZONE, "zone1")]], &[Some(&[])]);
    let err = requirement_terms(&params(&[], None, false, true), &view).unwrap_err();
    assert_eq!(err.to_string(), "no available topology found");
    let view = cluster(&[&[("other", "x")]], &[Some(&[ZONE])]);
    let err = requirement_terms(&params(&[], None, false, true), &view).unwrap_err();
    assert_eq!(
        err.to_string(),
        "topologyKeys [com.example.csi/zone] were not found on any nodes"
    );
}

#[test]
fn selected_node_errors_say_which_node_and_why() {
    let view = cluster(&[&[(ZONE, "zone1")]], &[Some(&[ZONE])]);
    let err = requirement_terms(&params(&[], Some("gone"), false, true), &view).unwrap_err();
    assert!(err.is_reschedule());
    assert_eq!(
        err.to_string(),
        r#"failed to get selected CSINode gone: csinode.storage.k8s.io "gone" not found"#
    );
    // CSINode present, driver absent.
    let view = cluster(&[&[(ZONE, "zone1")]], &[None]);
    let err = requirement_terms(&params(&[], Some("node-0"), false, true), &view).unwrap_err();
    assert_eq!(
        err,
        TopologyError::NoTopologyKeys {
            node: "node-0".to_owned(),
            driver_registered: false
        }
    );
    assert_eq!(err.to_string(), "no topology key found for node node-0");
    assert!(!err.is_reschedule());
    // CSINode present, Node gone.
    let view = StaticTopology {
        csinodes: cluster(&[], &[Some(&[ZONE])]).csinodes,
        nodes: vec![],
    };
    let err = requirement_terms(&params(&[], Some("node-0"), false, true), &view).unwrap_err();
    assert_eq!(
        err.to_string(),
        "topology labels from selected node map[] does not match topology keys from CSINode [com.example.csi/zone]"
    );
}

#[test]
fn node_mode_static_view_mirrors_node_get_info() {
    let segments: HashMap<String, String> = [(ZONE.to_owned(), "zone7".to_owned())]
        .into_iter()
        .collect();
    let view = StaticTopology::single_node("me", DRIVER, "id-me", &segments);
    let got = requirement_terms(&params(&[], Some("me"), true, true), &view).unwrap();
    assert_eq!(
        got,
        Some((vec![t(&[(ZONE, "zone7")])], vec![t(&[(ZONE, "zone7")])]))
    );
}
