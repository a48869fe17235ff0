//! Property tests of the claim decision (fault suite, issue 16): for any claim shape and any class
//! parameters (secret templates, sizes, access modes, data sources, junk), `decide_claim` does not
//! panic, never provisions what is not ours, being deleted, bound or already provisioned, and a
//! plan it makes is self-consistent (one name for request and PV, no secret data, a sane size).

use proptest::prelude::*;

use super::*;
use crate::testing::{DRIVER, pvc, sc};

const UID: &str = "11111111-2222-3333-4444-555555555555";

#[derive(Debug, Clone)]
struct Shape {
    provisioner: Option<&'static str>,
    class: Option<&'static str>,
    deleting: bool,
    bound_to: Option<String>,
    intent: Option<String>,
    size: String,
    modes: Vec<&'static str>,
    node: Option<String>,
    block: bool,
    source: Option<(Option<&'static str>, &'static str, String)>,
    junk: Vec<(String, String)>,
}

fn arb_shape() -> impl Strategy<Value = Shape> {
    (
        (
            // Weighted towards claims that get as far as a plan.
            prop::option::weighted(0.9, prop::sample::select(vec![DRIVER, DRIVER, DRIVER, "other.csi", ""])),
            prop::option::weighted(0.9, prop::sample::select(vec!["fast", "fast", "fast", "missing", ""])),
            prop::bool::weighted(0.2),
            prop::option::weighted(0.2, "[a-z0-9-]{0,12}"),
            prop::option::weighted(0.3, prop_oneof![Just(format!("pvc-{UID}")), "[a-z0-9-]{0,20}"]),
        ),
        (
            prop_oneof![
                3 => prop::sample::select(vec!["1Gi", "0", "-1", "1e3", "100Mi", "1.5Gi", "", "1Ei", "99999999Ei"])
                    .prop_map(str::to_owned),
                1 => "[0-9a-zA-Z.+-]{0,10}",
            ],
            prop::collection::vec(
                prop::sample::select(vec!["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod", "Bogus"]),
                0..3,
            ),
            prop::option::of("[a-z0-9.-]{0,10}"),
            any::<bool>(),
            prop::option::weighted(0.2, (
                prop::option::of(prop::sample::select(vec!["snapshot.storage.k8s.io", "", "example.com"])),
                prop::sample::select(vec!["PersistentVolumeClaim", "VolumeSnapshot", "Widget"]),
                "[a-z0-9-]{0,8}",
            )),
            prop::collection::vec(("[a-z./-]{1,20}", "\\PC{0,20}"), 0..3),
        ),
    )
        .prop_map(|((provisioner, class, deleting, bound_to, intent), (size, modes, node, block, source, junk))| Shape {
            provisioner,
            class,
            deleting,
            bound_to,
            intent,
            size,
            modes,
            node,
            block,
            source,
            junk,
        })
}

fn arb_params() -> impl Strategy<Value = Vec<(&'static str, String)>> {
    prop::collection::vec(
        (
            prop::sample::select(vec![
                "csi.storage.k8s.io/provisioner-secret-name",
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "csi.storage.k8s.io/node-stage-secret-name",
                "csi.storage.k8s.io/node-stage-secret-namespace",
                "csi.storage.k8s.io/fstype",
                "fstype",
                "csi.storage.k8s.io/unknown",
                "type",
            ]),
            prop_oneof![
                prop::sample::select(vec![
                    "${pvc.name}",
                    "${pvc.namespace}",
                    "${pv.name}",
                    "${pvc.annotations['team']}",
                    "${bogus}",
                    "${",
                    "a${pvc.name}b",
                    "",
                    "ext4",
                ])
                .prop_map(str::to_owned),
                "[a-z${}.\\[\\]']{0,16}",
            ],
        ),
        0..4,
    )
}

fn claim_of(shape: &Shape) -> crate::testing::PvcBuilder {
    let mut b = pvc("ns", "data").uid(UID).request(&shape.size);
    if let Some(p) = shape.provisioner {
        b = b.provisioner(p);
    }
    if let Some(c) = shape.class {
        b = b.class(c);
    }
    if !shape.modes.is_empty() {
        b = b.access_modes(shape.modes.clone());
    }
    if let Some(n) = &shape.node {
        b = b.selected_node(n);
    }
    if shape.block {
        b = b.volume_mode_block();
    }
    if let Some((group, kind, name)) = &shape.source {
        b = b.data_source(*group, kind, name);
    }
    if let Some(v) = &shape.bound_to {
        b = b.volume_name(v);
    }
    if let Some(v) = &shape.intent {
        b = b
            .annotation(names::ANN_INTENT_VOLUME_NAME, v)
            .finalizer(names::FINALIZER_PROVISIONING_INTENT);
    }
    for (k, v) in &shape.junk {
        b = b.annotation(k, v);
    }
    if shape.deleting {
        b = b.deleting();
    }
    b
}

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_claim_decision_never_provisions_what_it_must_not_and_its_plans_are_consistent(
        shape in arb_shape(),
        params in arb_params(),
        pv_exists in any::<bool>(),
        wffc in any::<bool>(),
    ) {
        let mut settings = ProvisionSettings {
            driver: DRIVER.to_owned(),
            provisioner_identity: "identity-1".to_owned(),
            volume_name_prefix: "pvc".to_owned(),
            immediate_topology: true,
            ..ProvisionSettings::default()
        };
        settings.plugin.controller_service = true;
        settings.controller.create_delete_volume = true;
        let mut class = params.iter().fold(sc("fast"), |b, (k, v)| b.param(k, v));
        if wffc {
            class = class.binding_wffc();
        }
        let class = class.build();
        let claim = claim_of(&shape).build();
        let facts = Facts {
            class: (shape.class == Some("fast")).then(|| Arc::new(class.clone())),
            pv_exists,
            topology: Arc::new(crate::provision::topology::StaticTopology::default()),
            selected_node_driver: CsiNodeLookup::Unknown,
            selected_node_uid: None,
            pinned_topology: None,
            vac: None,
            source: SourceLookup::NotResolved,
            node: None,
            clones_pending: false,
        };
        let decision = decide_claim(&claim, &settings, &facts);
        if let ClaimDecision::Provision(plan) = &decision {
            prop_assert_eq!(shape.provisioner, Some(DRIVER), "provisioned a claim that is not ours");
            prop_assert!(!shape.deleting, "provisioned a claim being deleted");
            prop_assert!(!pv_exists, "provisioned a claim whose PV exists");
            prop_assert!(shape.bound_to.as_deref().is_none_or(str::is_empty), "provisioned a bound claim");
            prop_assert_eq!(&plan.request.name, &plan.volume_name);
            prop_assert!(!plan.volume_name.is_empty());
            match &shape.intent {
                Some(recorded) if !recorded.is_empty() => prop_assert_eq!(&plan.volume_name, recorded),
                _ => prop_assert_eq!(&plan.volume_name, &format!("pvc-{UID}")),
            }
            prop_assert!(plan.request.secrets.is_empty(), "secret data is added by the shell only");
            let bytes = plan.request.capacity_range.as_ref().map_or(0, |r| r.required_bytes);
            prop_assert!(bytes >= 0);
            prop_assert!(!plan.request.volume_capabilities.is_empty());
        }
        if shape.deleting && shape.intent.is_none() {
            prop_assert!(
                matches!(decision, ClaimDecision::Ignore(_)),
                "a deleted claim without intent is left alone: {:?}", decision
            );
        }
    }
}
