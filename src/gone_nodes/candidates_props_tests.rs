//! Property tests of the dead-node candidate decision (fault suite, issue 16): for any PV shape,
//! `classify` does not panic and never answers what must be kept: another driver's volume, a
//! volume kept by its reclaim policy, a bound volume (only its claim, opt-in and by UID), a volume
//! whose node cannot be pinned to exactly one node, or a PV being deleted by someone else.

use proptest::prelude::*;

use super::*;
use crate::model::locate::{HOSTNAME_LABEL, Mode};
use crate::testing::pv;

const DRIVER: &str = "com.example.csi/test-driver";

#[derive(Debug, Clone)]
struct PvShape {
    driver: Option<&'static str>,
    reclaim: Option<&'static str>,
    phase: Option<&'static str>,
    finalizer: bool,
    deleting: bool,
    claim: Option<(&'static str, &'static str, &'static str)>,
    affinity: Vec<Vec<(&'static str, &'static str)>>,
    node_mode: bool,
    pvc_cleanup: bool,
}

fn arb_shape() -> impl Strategy<Value = PvShape> {
    let segment = (
        prop::sample::select(vec![
            HOSTNAME_LABEL,
            "topology.kubernetes.io/zone",
            "example.com/rack",
        ]),
        prop::sample::select(vec!["node-1", "node-2", "zone-a", ""]),
    );
    (
        prop::option::weighted(0.9, prop::sample::select(vec![DRIVER, DRIVER, "other.csi"])),
        prop::option::weighted(
            0.9,
            prop::sample::select(vec!["Delete", "Delete", "Retain", "Recycle"]),
        ),
        prop::option::weighted(
            0.9,
            prop::sample::select(vec!["Released", "Bound", "Available", "Pending", "Failed"]),
        ),
        any::<bool>(),
        prop::bool::weighted(0.3),
        prop::option::weighted(
            0.7,
            (
                prop::sample::select(vec!["ns", ""]),
                prop::sample::select(vec!["claim", ""]),
                prop::sample::select(vec!["uid-1", ""]),
            ),
        ),
        prop::collection::vec(prop::collection::vec(segment, 0..3), 0..3),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                driver,
                reclaim,
                phase,
                finalizer,
                deleting,
                claim,
                affinity,
                node_mode,
                pvc_cleanup,
            )| PvShape {
                driver,
                reclaim,
                phase,
                finalizer,
                deleting,
                claim,
                affinity,
                node_mode,
                pvc_cleanup,
            },
        )
}

fn build(shape: &PvShape) -> PersistentVolume {
    let mut b = pv("pv-1").handle("vol-1");
    b = match shape.driver {
        Some(d) => b.driver(d),
        None => b.no_csi(),
    };
    if let Some(r) = shape.reclaim {
        b = b.reclaim(r);
    }
    if let Some(p) = shape.phase {
        b = b.phase(p);
    }
    if shape.finalizer {
        b = b.finalizer(names::FINALIZER_PV_DELETION_PROTECTION);
    }
    if shape.deleting {
        b = b.deleting();
    }
    if let Some((ns, name, uid)) = shape.claim {
        b = b.claim_ref(ns, name, uid);
    }
    for term in &shape.affinity {
        b = b.node_affinity(term.iter().copied());
    }
    let mut pv = b.build();
    if shape.reclaim.is_none() {
        pv.spec.as_mut().unwrap().persistent_volume_reclaim_policy = None;
    }
    pv
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn only_released_or_opted_in_volumes_of_ours_on_one_node_are_answered(shape in arb_shape()) {
        let pv = build(&shape);
        let mode = if shape.node_mode { Mode::Node } else { Mode::Controller };
        let config = GoneConfig::new(DRIVER, mode, std::time::Duration::from_secs(300), shape.pvc_cleanup);
        let Ok(candidate) = classify(&pv, &config) else {
            return Ok(());
        };
        prop_assert_eq!(shape.driver, Some(DRIVER), "another driver's volume");
        prop_assert_eq!(shape.reclaim, Some("Delete"), "a volume its reclaim policy keeps");
        prop_assert!(!shape.deleting || shape.finalizer, "a PV someone else is deleting");
        // The node is one node: a name, or a per-node key with a value.
        match &candidate.query {
            crate::model::locate::NodeQuery::ByName { name, .. } => prop_assert!(!name.is_empty()),
            crate::model::locate::NodeQuery::ByLabel { key, value } => {
                prop_assert_eq!(key.as_str(), HOSTNAME_LABEL);
                prop_assert!(!value.is_empty());
            }
        }
        match candidate.target {
            Answer::Volume { delete_object, remove_finalizer } => {
                prop_assert_eq!(shape.phase, Some("Released"), "only a released volume is deleted");
                prop_assert_eq!(delete_object, !shape.deleting);
                prop_assert_eq!(remove_finalizer, shape.finalizer);
            }
            Answer::Claim(claim) => {
                prop_assert_eq!(shape.phase, Some("Bound"));
                prop_assert!(shape.pvc_cleanup, "a bound claim deleted without the opt-in");
                let (ns, name, uid) = shape.claim.expect("a claim reference");
                prop_assert!(!uid.is_empty(), "a claim deleted without a UID precondition");
                prop_assert!(!ns.is_empty() && !name.is_empty(), "a claim reference without a name");
                prop_assert_eq!((claim.namespace.as_str(), claim.name.as_str(), claim.uid.as_str()), (ns, name, uid));
            }
        }
    }
}
