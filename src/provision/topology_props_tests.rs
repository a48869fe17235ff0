//! Property tests of the accessibility requirement (fault suite, issue 16): for any nodes,
//! CSINodes, allowedTopologies, selected node and flags, building the requirement does not panic,
//! is deterministic (a retry sends the same request), and what it builds holds upstream's rules:
//! requisite sorted without duplicates, preferred a reordering of requisite, a strict selected
//! node's term alone, a selected node's term first, allowedTopologies never widened.

use proptest::prelude::*;

use super::*;
use crate::testing::{csinode, node, topology_term};

const DRIVER: &str = "com.example.csi/test-driver";
const KEYS: [&str; 3] = [
    "com.example.csi/zone",
    "com.example.csi/rack",
    "com.example.csi/other",
];

/// One node: labels (key index, value), and the keys its CSINode registers for our driver
/// (`None`: no CSINode; `Some(None)`: a CSINode without our driver).
type NodeShape = (Vec<(usize, &'static str)>, Option<Option<Vec<usize>>>);

#[derive(Debug, Clone)]
struct TopologyCase {
    nodes: Vec<NodeShape>,
    allowed: Vec<Vec<(usize, Vec<&'static str>)>>,
    selected: Option<usize>,
    strict: bool,
    immediate: bool,
    claim: String,
}

fn arb_world() -> impl Strategy<Value = TopologyCase> {
    let value = prop::sample::select(vec!["a", "b", "c", ""]);
    let labels = prop::collection::vec((0..KEYS.len(), value.clone()), 0..3);
    let keys = prop::option::weighted(
        0.85,
        prop::option::weighted(0.9, prop::collection::vec(0..KEYS.len(), 0..3)),
    );
    (
        prop::collection::vec((labels, keys), 0..5),
        prop::collection::vec(
            prop::collection::vec((0..KEYS.len(), prop::collection::vec(value, 0..3)), 0..3),
            0..3,
        ),
        prop::option::of(0..6usize),
        any::<bool>(),
        any::<bool>(),
        "[a-z0-9-]{0,20}",
    )
        .prop_map(
            |(nodes, allowed, selected, strict, immediate, claim)| TopologyCase {
                nodes,
                allowed,
                selected,
                strict,
                immediate,
                claim,
            },
        )
}

fn view(world: &TopologyCase) -> StaticTopology {
    let mut topology = StaticTopology::default();
    for (i, (labels, keys)) in world.nodes.iter().enumerate() {
        let name = format!("node-{i}");
        topology.nodes.push(Arc::new(
            node(&name)
                .labels(labels.iter().map(|(k, v)| (KEYS[*k], *v)))
                .build(),
        ));
        if let Some(keys) = keys {
            let mut b = csinode(&name).driver("other.csi", &name, [KEYS[0]]);
            if let Some(keys) = keys {
                b = b.driver(DRIVER, &name, keys.iter().map(|k| KEYS[*k]));
            }
            topology.csinodes.push(Arc::new(b.build()));
        }
    }
    topology
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn requirements_keep_upstreams_rules(world in arb_world()) {
        let topology = view(&world);
        let allowed: Vec<TopologySelectorTerm> = world
            .allowed
            .iter()
            .map(|term| topology_term(term.iter().map(|(k, v)| (KEYS[*k], v.clone()))))
            .collect();
        let selected = world.selected.map(|i| format!("node-{i}"));
        let params = TopologyParams {
            driver: DRIVER,
            claim_name: &world.claim,
            allowed_topologies: &allowed,
            selected_node: selected.as_deref(),
            strict: world.strict,
            immediate: world.immediate,
        };
        let first = requirement_terms(&params, &topology);
        // Deterministic: a retry of the same claim sends the same requirement.
        prop_assert_eq!(format!("{first:?}"), format!("{:?}", requirement_terms(&params, &topology)));
        let Ok(Some((requisite, preferred))) = first else {
            if let Ok(None) = first {
                // No requirement only without a node, or with allowedTopologies that say nothing.
                prop_assert!(selected.is_none() || flatten(&allowed).iter().all(|t| t.0.is_empty()) && !allowed.is_empty());
            }
            return Ok(());
        };
        prop_assert!(!requisite.is_empty());
        let mut sorted = requisite.clone();
        sort_and_dedupe(&mut sorted);
        prop_assert_eq!(&sorted, &requisite, "requisite is sorted and without duplicates");
        let mut reordered = preferred.clone();
        sort_and_dedupe(&mut reordered);
        prop_assert_eq!(&reordered, &requisite, "preferred is requisite reordered");
        prop_assert_eq!(preferred.len(), requisite.len());
        if let Some(name) = &selected {
            let labels = topology.node(name).and_then(|n| n.metadata.labels.clone()).unwrap_or_default();
            let node_term_holds = |t: &Term| t.0.iter().all(|(k, v)| labels.get(k) == Some(v));
            // The selected node can hold the first preferred term.
            prop_assert!(node_term_holds(&preferred[0]), "{:?} not on {name}", preferred[0]);
            if world.strict {
                prop_assert_eq!(requisite.len(), 1, "strict: the node's term alone");
            }
        }
        if !(allowed.is_empty() || world.strict && selected.is_some()) {
            // allowedTopologies are never widened.
            let allowed_terms = flatten(&allowed);
            prop_assert!(requisite.iter().all(|t| allowed_terms.contains(t)));
        }
    }
}
