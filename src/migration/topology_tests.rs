//! Upstream's csi-translation-lib test vectors for the shared topology rules (restated).

use super::*;

const GKE: &str = "topology.gke.io/zone";

fn req(key: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_owned(),
        operator: "In".to_owned(),
        values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
    }
}

/// A PV with these labels and node-affinity terms (each a list of expressions).
pub(crate) fn pv_with(
    labels: &[(&str, &str)],
    terms: Vec<Vec<NodeSelectorRequirement>>,
) -> PersistentVolume {
    let mut pv = PersistentVolume::default();
    if !labels.is_empty() {
        pv.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
    }
    if !terms.is_empty() {
        pv.spec.get_or_insert_default().node_affinity = Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: terms
                    .into_iter()
                    .map(|t| NodeSelectorTerm {
                        match_expressions: Some(t),
                        match_fields: None,
                    })
                    .collect(),
            }),
        });
    }
    pv
}

fn terms_of(pv: &PersistentVolume) -> Vec<Vec<(String, Vec<String>)>> {
    terms(pv)
        .iter()
        .map(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .map(|e| (e.key.clone(), e.values.clone().unwrap_or_default()))
                .collect()
        })
        .collect()
}

fn t(pairs: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.iter().map(|s| (*s).to_owned()).collect()))
        .collect()
}

fn labels(pv: &PersistentVolume) -> Vec<(String, String)> {
    pv.metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect()
}

fn l(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    v.sort();
    v
}

#[test]
fn csi_to_in_tree_renames_zones_adds_regions_and_labels_only_where_absent() {
    // 1. GA labels, GA region and the driver's zone key: the key is renamed, order kept.
    let mut pv = pv_with(
        &[(GA_ZONE, "us-east1-a"), (GA_REGION, "us-east1")],
        vec![vec![
            req(GA_REGION, &["us-east1"]),
            req(GKE, &["us-east1-a"]),
        ]],
    );
    csi_to_in_tree(&mut pv, GKE, Some(gce_region)).unwrap();
    assert_eq!(
        terms_of(&pv),
        [t(&[(GA_REGION, &["us-east1"]), (GA_ZONE, &["us-east1-a"])])]
    );
    assert_eq!(
        labels(&pv),
        l(&[(GA_ZONE, "us-east1-a"), (GA_REGION, "us-east1")])
    );
    // 2. The beta analogue.
    let mut pv = pv_with(
        &[(BETA_ZONE, "us-west2-b"), (BETA_REGION, "us-west2")],
        vec![vec![
            req(BETA_REGION, &["us-west2"]),
            req(GKE, &["us-west2-b"]),
        ]],
    );
    csi_to_in_tree(&mut pv, GKE, Some(gce_region)).unwrap();
    assert_eq!(
        terms_of(&pv),
        [t(&[
            (BETA_REGION, &["us-west2"]),
            (BETA_ZONE, &["us-west2-b"])
        ])]
    );
    // 3. Existing labels are never overwritten.
    let mut pv = pv_with(
        &[(GA_ZONE, "existingZone"), (GA_REGION, "existingRegion")],
        vec![vec![req(GKE, &["us-east1-a"])]],
    );
    csi_to_in_tree(&mut pv, GKE, Some(gce_region)).unwrap();
    assert_eq!(
        terms_of(&pv),
        [t(&[(GA_ZONE, &["us-east1-a"]), (GA_REGION, &["us-east1"])])]
    );
    assert_eq!(
        labels(&pv),
        l(&[(GA_ZONE, "existingZone"), (GA_REGION, "existingRegion")])
    );
    // 5. No labels: both are added.
    let mut pv = pv_with(&[], vec![vec![req(GKE, &["us-east1-a"])]]);
    csi_to_in_tree(&mut pv, GKE, Some(gce_region)).unwrap();
    assert_eq!(
        terms_of(&pv),
        [t(&[(GA_ZONE, &["us-east1-a"]), (GA_REGION, &["us-east1"])])]
    );
    assert_eq!(
        labels(&pv),
        l(&[(GA_ZONE, "us-east1-a"), (GA_REGION, "us-east1")])
    );
    // 6. A beta zone expression keeps the beta family.
    let mut pv = pv_with(&[], vec![vec![req(BETA_ZONE, &["us-west2-b"])]]);
    csi_to_in_tree(&mut pv, GKE, Some(gce_region)).unwrap();
    assert_eq!(
        terms_of(&pv),
        [t(&[
            (BETA_ZONE, &["us-west2-b"]),
            (BETA_REGION, &["us-west2"])
        ])]
    );
    assert_eq!(
        labels(&pv),
        l(&[(BETA_ZONE, "us-west2-b"), (BETA_REGION, "us-west2")])
    );
    // 7. Without a region parser only the zone.
    let mut pv = pv_with(&[], vec![vec![req(GKE, &["us-east1-a"])]]);
    csi_to_in_tree(&mut pv, GKE, None).unwrap();
    assert_eq!(terms_of(&pv), [t(&[(GA_ZONE, &["us-east1-a"])])]);
    assert_eq!(labels(&pv), l(&[(GA_ZONE, "us-east1-a")]));
    // 8. Two terms: each gets its region; the zone label joins both zones.
    let mut pv = pv_with(
        &[],
        vec![
            vec![req(GKE, &["us-east1-a"])],
            vec![req(GKE, &["us-east1-c"])],
        ],
    );
    csi_to_in_tree(&mut pv, GKE, Some(gce_region)).unwrap();
    assert_eq!(
        terms_of(&pv),
        [
            t(&[(GA_ZONE, &["us-east1-a"]), (GA_REGION, &["us-east1"])]),
            t(&[(GA_ZONE, &["us-east1-c"]), (GA_REGION, &["us-east1"])])
        ]
    );
    assert_eq!(
        labels(&pv),
        l(&[(GA_ZONE, "us-east1-a__us-east1-c"), (GA_REGION, "us-east1")])
    );
    // 9. Cinder's key, no parser.
    let cinder = "topology.cinder.csi.openstack.org/zone";
    let mut pv = pv_with(&[], vec![vec![req(cinder, &["nova"])]]);
    csi_to_in_tree(&mut pv, cinder, None).unwrap();
    assert_eq!(terms_of(&pv), [t(&[(GA_ZONE, &["nova"])])]);
    assert_eq!(labels(&pv), l(&[(GA_ZONE, "nova")]));
}

#[test]
fn in_tree_to_csi_moves_zones_to_the_driver_key_and_beta_regions_to_ga() {
    let mut pv = pv_with(
        &[(GA_ZONE, "us-east1-a"), (GA_REGION, "us-east1")],
        vec![vec![
            req(GA_ZONE, &["us-east1-a"]),
            req(GA_REGION, &["us-east1"]),
        ]],
    );
    in_tree_to_csi(&mut pv, GKE);
    assert_eq!(
        terms_of(&pv),
        [t(&[(GKE, &["us-east1-a"]), (GA_REGION, &["us-east1"])])]
    );
    let mut pv = pv_with(
        &[(GA_ZONE, "us-east1-a"), (GA_REGION, "us-east1")],
        vec![vec![
            req(BETA_ZONE, &["us-west2-b"]),
            req(BETA_REGION, &["us-west2"]),
        ]],
    );
    in_tree_to_csi(&mut pv, GKE);
    assert_eq!(
        terms_of(&pv),
        [t(&[(GKE, &["us-west2-b"]), (GA_REGION, &["us-west2"])])]
    );
    // Without affinity the zone label becomes one.
    let mut pv = pv_with(&[(BETA_ZONE, "europe-west1-b__europe-west1-c")], vec![]);
    in_tree_to_csi(&mut pv, GKE);
    assert_eq!(
        terms_of(&pv),
        [t(&[(GKE, &["europe-west1-b", "europe-west1-c"])])]
    );
}

#[test]
fn allowed_topologies_get_the_driver_key_for_zones_only() {
    let term = |pairs: &[(&str, &[&str])]| TopologySelectorTerm {
        match_label_expressions: Some(
            pairs
                .iter()
                .map(|(k, v)| TopologySelectorLabelRequirement {
                    key: (*k).to_owned(),
                    values: v.iter().map(|s| (*s).to_owned()).collect(),
                })
                .collect(),
        ),
    };
    let same = [term(&[(GKE, &["foo", "bar"])])];
    assert_eq!(translate_allowed_topologies(&same, GKE), same);
    assert_eq!(
        translate_allowed_topologies(&[term(&[(BETA_ZONE, &["foo", "bar"])])], GKE),
        [term(&[(GKE, &["foo", "bar"])])]
    );
    assert_eq!(
        translate_allowed_topologies(
            &[term(&[
                (BETA_ZONE, &["foo", "bar"]),
                (GKE, &["boo", "baz"])
            ])],
            GKE
        ),
        [term(&[(GKE, &["foo", "bar"]), (GKE, &["boo", "baz"])])],
        "not merged"
    );
    let other = [term(&[("test", &["foo", "bar"])])];
    assert_eq!(translate_allowed_topologies(&other, GKE), other);
}

#[test]
fn add_topology_trims_dedups_sorts_and_refuses_nothing_to_add() {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let mut pv = PersistentVolume::default();
    assert!(add_topology(&mut pv, GKE, &[]).is_err());
    assert_eq!(
        add_topology(&mut pv, GKE, &s(&[" ", "\n", "\t", "  "])).unwrap_err(),
        "there are no valid zones to add to pv"
    );
    add_topology(&mut pv, GKE, &s(&[" ", "us-central1-a"])).unwrap();
    assert_eq!(terms_of(&pv), [t(&[(GKE, &["us-central1-a"])])]);
    let mut pv = PersistentVolume::default();
    add_topology(
        &mut pv,
        GKE,
        &s(&[
            "us-central1-f",
            "us-central1-a",
            "us-central1-c",
            "us-central1-b",
        ]),
    )
    .unwrap();
    assert_eq!(
        terms_of(&pv),
        [t(&[(
            GKE,
            &[
                "us-central1-a",
                "us-central1-b",
                "us-central1-c",
                "us-central1-f"
            ]
        )])]
    );
}

#[test]
fn replace_topology_renames_every_expression_without_merging() {
    let mut pv = pv_with(
        &[],
        vec![
            vec![req(GKE, &["us-east1-a"]), req(GA_ZONE, &["us-east1-c"])],
            vec![req("other", &["x"])],
        ],
    );
    replace_topology(&mut pv, GKE, GA_ZONE);
    assert_eq!(
        terms_of(&pv),
        [
            t(&[(GA_ZONE, &["us-east1-a"]), (GA_ZONE, &["us-east1-c"])]),
            t(&[("other", &["x"])])
        ]
    );
}

#[test]
fn regions_of_gce_and_aws_zones() {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        gce_region(&s(&["us-central1-a", "us-central1-c"])).unwrap(),
        "us-central1"
    );
    assert_eq!(gce_region(&[]).unwrap_err(), "no zones specified");
    assert_eq!(
        gce_region(&s(&["us-central1-a", "us-east1-b"])).unwrap_err(),
        "multiple or no regions gotten from zones, got: map[us-central1:{} us-east1:{}]"
    );
    assert_eq!(
        gce_region(&s(&["nova"])).unwrap_err(),
        "zone in unexpected format, expected: {locale}-{region}-{zone}, got: nova"
    );
    for (zones, region) in [
        (&["us-west-2a", "us-west-2b"][..], "us-west-2"),
        (&["us-gov-east-1a"][..], "us-gov-east-1"),
        (&["us-east-1-wl1-bos-wlz-1"][..], "us-east-1"),
        (&["us-west-2-lax-1a"][..], "us-west-2"),
    ] {
        assert_eq!(aws_region(&s(zones)).unwrap(), region, "{zones:?}");
    }
    for zones in [
        &[][..],
        &["us-west-2a", "us-east-1a"][..],
        &["us-west-2"][..],
        &["us-west-2ab"][..],
        &["us-west"][..],
    ] {
        assert!(aws_region(&s(zones)).is_err(), "{zones:?}");
    }
    assert_eq!(
        aws_region(&s(&["us-west"])).unwrap_err(),
        "Unexpected zone format: us-west is not a valid AWS zone"
    );
}

/// Found by `region_rules_take_any_zones_without_panic`'s zones (also reached through a CSI PV's
/// affinity): a two-byte last character was split mid-character and panicked. Go drops one byte.
#[test]
fn an_aws_zone_ending_in_a_wide_character_is_not_a_panic() {
    assert_eq!(
        aws_region(&["us-west-\u{e9}".to_owned()]),
        Ok("us-west-\u{FFFD}".to_owned())
    );
    assert_eq!(
        aws_region(&["us-west-2a".to_owned()]),
        Ok("us-west-2".to_owned())
    );
}
