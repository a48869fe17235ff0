//! Tests of `plan`: upstream `TestProvision`/`TestShouldProvision` cases (names kept in comments)
//! and what the decision leaves to the intent log.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};

use super::*;
use crate::csi::v1::volume_capability::AccessType;
use crate::csi::v1::volume_capability::access_mode::Mode;
use crate::model::secrets::SecretRef;
use crate::node_mode::ownership;
use crate::provision::classify::ProvisioningState;
use crate::provision::request::ContentSource;
use crate::provision::topology::StaticTopology;
use crate::testing::{DRIVER, PvcBuilder, csinode, node, pvc, sc, vac};

const UID: &str = "11111111-2222-3333-4444-555555555555";
const ZONE: &str = "topology.mock.csi/zone";

/// One scenario's world: settings and what the shell found in its caches.
struct World {
    settings: ProvisionSettings,
    class: Option<StorageClass>,
    pv_exists: bool,
    view: StaticTopology,
    selected_node_driver: CsiNodeLookup,
    selected_node_uid: Option<String>,
    vac: Option<VolumeAttributesClass>,
    vac_missing: bool,
    source: SourceLookup,
    pinned: Option<crate::csi::v1::TopologyRequirement>,
    /// Node mode: the volume the selected node recorded for the claim (besides a claim record).
    recorded_on_selected: Option<String>,
}

impl World {
    fn new() -> Self {
        let mut settings = ProvisionSettings {
            driver: DRIVER.to_owned(),
            provisioner_identity: "identity-1".to_owned(),
            volume_name_prefix: "pvc".to_owned(),
            immediate_topology: true,
            volume_attributes_class: true,
            ..ProvisionSettings::default()
        };
        settings.plugin.controller_service = true;
        settings.controller.create_delete_volume = true;
        World {
            settings,
            class: Some(sc("fast").build()),
            pv_exists: false,
            view: StaticTopology::default(),
            selected_node_driver: CsiNodeLookup::Unknown,
            selected_node_uid: None,
            vac: None,
            vac_missing: false,
            source: SourceLookup::NotResolved,
            pinned: None,
            recorded_on_selected: None,
        }
    }

    fn class(mut self, class: crate::testing::ScBuilder) -> Self {
        self.class = Some(class.build());
        self
    }

    fn topology(mut self) -> Self {
        self.settings.topology = true;
        self
    }

    /// Node mode: the facts the shell computes once (`controller::gather`).
    fn node_facts(&self, claim: &PersistentVolumeClaim) -> Option<NodeFacts> {
        let mode = self.settings.node.as_ref()?;
        if not_to_provision(claim, &self.settings).is_some() {
            return None;
        }
        let ownership = ownership::check_node(
            claim,
            &ownership::OwnershipInputs {
                me: &mode.me,
                driver: &self.settings.driver,
                topology_supported: self.settings.topology,
                immediate_binding: mode.immediate_binding,
                storage_class: self.class.as_ref(),
                selected_node_driver: self.selected_node_driver,
            },
        );
        let recorded_on_selected = match &ownership {
            ClaimOwnership::ClearSelectedNode(_) => {
                self.recorded_on_selected.clone().or_else(|| {
                    crate::provision::controller::intents::claim_record::entry_of(claim)
                        .map(|e| e.volume)
                })
            }
            _ => None,
        };
        Some(NodeFacts {
            ownership,
            recorded_on_selected,
        })
    }

    /// The facts the shell would have gathered (`controller::gather`).
    fn facts(&self, claim: &PersistentVolumeClaim) -> Facts {
        Facts {
            class: self.class.clone().map(Arc::new),
            pv_exists: self.pv_exists,
            topology: Arc::new(self.view.clone()),
            selected_node_driver: self.selected_node_driver,
            selected_node_uid: self.selected_node_uid.clone(),
            pinned_topology: self.pinned.clone(),
            vac: match (&self.vac, self.vac_missing) {
                (Some(v), _) => Some(Ok(Some(v.clone()))),
                (None, true) => Some(Ok(None)),
                (None, false) => None,
            },
            source: self.source.clone(),
            node: self.node_facts(claim),
            clones_pending: false,
        }
    }

    fn decide(&self, claim: PvcBuilder) -> ClaimDecision {
        let claim = claim.build();
        decide_claim(&claim, &self.settings, &self.facts(&claim))
    }

    fn provision(&self, claim: PvcBuilder) -> ProvisionPlan {
        match self.decide(claim) {
            ClaimDecision::Provision(p) => *p,
            other => panic!("expected Provision, got {other:?}"),
        }
    }

    fn fail(&self, claim: PvcBuilder) -> PlanError {
        match self.decide(claim) {
            ClaimDecision::Fail(e) => e,
            other => panic!("expected Fail, got {other:?}"),
        }
    }

    fn ignore(&self, claim: PvcBuilder) -> IgnoreReason {
        match self.decide(claim) {
            ClaimDecision::Ignore(r) => r,
            other => panic!("expected Ignore, got {other:?}"),
        }
    }
}

/// A pending claim of ours in class `fast`.
fn claim() -> PvcBuilder {
    pvc("ns", "data").uid(UID).provisioner(DRIVER).class("fast")
}

fn mount(plan: &ProvisionPlan) -> (String, Vec<String>) {
    match plan.request.volume_capabilities[0].access_type.as_ref() {
        Some(AccessType::Mount(m)) => (m.fs_type.clone(), m.mount_flags.clone()),
        other => panic!("expected a mount capability, got {other:?}"),
    }
}

// === Upstream TestProvision / TestShouldProvision ===

#[test]
fn normal_provision() {
    let w = World::new().class(sc("fast").param("fstype", "ext3").param("other", "x"));
    let plan = w.provision(claim());
    let name = format!("pvc-{UID}");
    assert_eq!(plan.volume_name, name);
    assert_eq!(plan.request.name, name);
    assert_eq!(
        plan.request.capacity_range.as_ref().unwrap().required_bytes,
        1 << 30
    );
    assert_eq!(plan.request.capacity_range.as_ref().unwrap().limit_bytes, 0);
    assert_eq!(
        plan.request.parameters.len(),
        2,
        "deprecated fstype is passed on"
    );
    assert!(plan.request.secrets.is_empty());
    assert_eq!(plan.request.accessibility_requirements, None);
    assert_eq!(mount(&plan).0, "ext3");
    assert_eq!(plan.provisioner_secret, None);
    assert_eq!(plan.pv.class_name, "fast");
    assert_eq!(plan.pv.claim_ref.uid.as_deref(), Some(UID));
    assert_eq!(plan.pv.provisioner_identity, "identity-1");
    assert_eq!(plan.class_uid, "uid-fast");
    assert!(!plan.may_reschedule);
    assert_eq!(
        plan.warnings.len(),
        1,
        "deprecated fstype key is warned about"
    );
}

#[test]
fn normal_provision_with_extra_metadata() {
    let mut w = World::new();
    w.settings.extra_create_metadata = true;
    let plan = w.provision(claim());
    let p = &plan.request.parameters;
    assert_eq!(p[names::PARAM_PVC_NAME], "data");
    assert_eq!(p[names::PARAM_PVC_NAMESPACE], "ns");
    assert_eq!(p[names::PARAM_PV_NAME], format!("pvc-{UID}"));
}

#[test]
fn multiple_fs_type_provision() {
    let w = World::new().class(
        sc("fast")
            .param("fstype", "ext3")
            .param(names::PARAM_FSTYPE, "xfs"),
    );
    assert_eq!(
        w.fail(claim()).to_string(),
        "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys"
    );
}

#[test]
fn provision_with_prefixed_fs_type_key_and_default_fs_type() {
    let w = World::new().class(sc("fast").param(names::PARAM_FSTYPE, "xfs"));
    let plan = w.provision(claim());
    assert_eq!(mount(&plan).0, "xfs");
    assert!(
        plan.request.parameters.is_empty(),
        "reserved keys are stripped"
    );
    assert_eq!(plan.pv.fs_type, "xfs");
    let mut w = World::new();
    w.settings.default_fs_type = "ext4".to_owned();
    assert_eq!(mount(&w.provision(claim())).0, "ext4");
}

#[test]
fn provision_with_access_mode_multi_node_multi_readonly_with_sidecar_arg() {
    let rox = || claim().access_modes(["ReadOnlyMany"]);
    let mut w = World::new();
    assert!(!w.provision(rox()).pv.read_only);
    w.settings.controller_publish_read_only = true;
    assert!(w.provision(rox()).pv.read_only);
    // Only a single ReadOnlyMany mode makes the PV read-only.
    assert!(
        !w.provision(claim().access_modes(["ReadOnlyMany", "ReadWriteOnce"]))
            .pv
            .read_only
    );
}

#[test]
fn provision_with_single_node_multi_writer_capability() {
    let mut w = World::new();
    w.settings.controller.single_node_multi_writer = true;
    let plan = w.provision(claim().access_modes(["ReadWriteOncePod"]));
    assert_eq!(
        plan.request.volume_capabilities[0]
            .access_mode
            .as_ref()
            .unwrap()
            .mode,
        Mode::SingleNodeSingleWriter as i32
    );
}

#[test]
fn provision_with_secrets_and_default_secrets_with_template() {
    let w = World::new().class(
        sc("fast")
            .param(names::PARAM_PROVISIONER_SECRET_NAME, "prov-${pvc.name}")
            .param(
                names::PARAM_PROVISIONER_SECRET_NAMESPACE,
                "${pvc.namespace}",
            )
            .param(names::PARAM_SECRET_NAME, "${pvc.annotations['team']}")
            .param(names::PARAM_SECRET_NAMESPACE, "default"),
    );
    let plan = w.provision(claim().annotation("team", "blue"));
    assert_eq!(
        plan.provisioner_secret,
        Some(SecretRef::new("prov-data", "ns"))
    );
    assert_eq!(plan.pv.secrets.provisioner, plan.provisioner_secret);
    assert_eq!(
        plan.pv.secrets.node_stage,
        Some(SecretRef::new("blue", "default"))
    );
    assert!(plan.request.parameters.is_empty());
}

#[test]
fn fail_to_get_secret_reference() {
    let w = World::new().class(
        sc("fast")
            .param(
                names::PARAM_NODE_STAGE_SECRET_NAME,
                "${pvc.annotations['missing']}",
            )
            .param(names::PARAM_NODE_STAGE_SECRET_NAMESPACE, "ns"),
    );
    let err = w.fail(claim());
    assert!(matches!(err, PlanError::Secret(_)));
    assert_eq!(
        err.to_string(),
        r#"error resolving value "${pvc.annotations['missing']}": invalid tokens: ["pvc.annotations['missing']"]"#
    );
}

#[test]
fn fail_not_nil_selector() {
    let err = World::new().fail(claim().selector("tier", "gold"));
    assert_eq!(err.to_string(), "claim Selector is not supported");
    assert!(err.follows_provisioning_event());
}

#[test]
fn fail_to_make_volume_name() {
    let err = World::new().fail(claim().no_uid());
    assert_eq!(err.to_string(), "corrupted PVC object, it is missing UID");
    let mut w = World::new();
    w.settings.volume_name_prefix = String::new();
    assert_eq!(
        w.fail(claim()).to_string(),
        "volume name prefix cannot be of length 0"
    );
}

#[test]
fn volume_name_uuid_length_truncates() {
    let mut w = World::new();
    w.settings.volume_name_prefix = "vol".to_owned();
    w.settings.volume_name_uuid_length = Some(8);
    assert_eq!(w.provision(claim()).volume_name, "vol-11111111");
}

#[test]
fn provision_with_volume_mode_block_and_filesystem() {
    let w = World::new().class(sc("fast").param(names::PARAM_FSTYPE, "ext4"));
    let plan = w.provision(claim().volume_mode_block());
    assert!(matches!(
        plan.request.volume_capabilities[0].access_type,
        Some(AccessType::Block(_))
    ));
    assert!(plan.pv.block);
    assert_eq!(plan.pv.volume_mode.as_deref(), Some("Block"));
    let plan = w.provision(claim().volume_mode_filesystem());
    assert_eq!(mount(&plan).0, "ext4");
    assert_eq!(plan.pv.volume_mode.as_deref(), Some("Filesystem"));
}

#[test]
fn provision_with_mount_options_and_class_settings() {
    let w = World::new().class(
        sc("fast")
            .mount_options(["noatime", "discard"])
            .reclaim_retain(),
    );
    let plan = w.provision(claim());
    assert_eq!(mount(&plan).1, vec!["noatime", "discard"]);
    assert_eq!(
        plan.pv.mount_options,
        Some(vec!["noatime".to_owned(), "discard".to_owned()])
    );
    assert_eq!(plan.pv.reclaim_policy.as_deref(), Some("Retain"));
}

#[test]
fn provision_with_any_volume_data_source() {
    let r = World::new().ignore(claim().data_source(Some("populator.example.com"), "Blob", "b1"));
    assert_eq!(r, IgnoreReason::ExternalPopulator("Blob".to_owned()));
}

#[test]
fn snapshot_and_clone_sources_need_capabilities_then_a_resolved_handle() {
    let snap = || claim().data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "s1");
    let clone = || claim().data_source(None, "PersistentVolumeClaim", "src");
    let mut w = World::new();
    assert_eq!(
        w.fail(snap()).to_string(),
        "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"
    );
    assert_eq!(
        w.fail(clone()).to_string(),
        "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported"
    );
    w.settings.controller.create_delete_snapshot = true;
    w.settings.controller.clone_volume = true;
    let err = w.fail(snap());
    assert!(
        err.to_string()
            .starts_with("error getting handle for DataSource Type VolumeSnapshot by Name s1: ")
    );
    assert_eq!(err.state(), ProvisioningState::NoChange);
    w.source = SourceLookup::Resolved(ContentSource::Snapshot {
        snapshot_id: "snap-handle".to_owned(),
    });
    let plan = w.provision(snap());
    assert!(plan.request.volume_content_source.is_some());
    assert!(plan.pv.expects_content_source);
    w.source = SourceLookup::Failed("snapshot s1 is not Ready".to_owned());
    assert_eq!(
        w.fail(snap()).to_string(),
        "error getting handle for DataSource Type VolumeSnapshot by Name s1: snapshot s1 is not Ready"
    );
    assert_eq!(
        w.fail(claim().data_source(Some("example.com"), "VolumeSnapshot", "s1"))
            .to_string(),
        "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got example.com"
    );
    assert_eq!(
        w.fail(claim().data_source(None, "PersistentVolumeClaim", ""))
            .to_string(),
        "the PVC source not found for PVC data"
    );
}

/// Issue 41: a data source is read exactly when the decision gets to it, and checked against the
/// class the plan reads: under CSI migration the translated one, whose provisioner is our driver
/// for Portworx and stays the in-tree name for EBS (so upstream refuses an EBS clone).
#[test]
fn the_data_source_is_read_for_the_translated_class_when_the_decision_needs_it() {
    let clone = |driver: &str| {
        pvc("ns", "copy")
            .uid(UID)
            .provisioner(driver)
            .class("c")
            .data_source(None, "PersistentVolumeClaim", "src")
            .build()
    };
    let world = |driver: &str, class: &StorageClass| {
        let mut w = World::new();
        w.settings.driver = driver.to_owned();
        w.settings.controller.clone_volume = true;
        w.class = Some(class.clone());
        w
    };
    let provisioner_read = |driver: &str, class: &StorageClass, claim: &PersistentVolumeClaim| {
        let w = world(driver, class);
        source_to_read(claim, &w.settings, &w.facts(claim)).map(|need| need.driver)
    };
    let px = "pxd.portworx.com";
    let portworx = sc("c").provisioner("kubernetes.io/portworx-volume").build();
    assert_eq!(
        provisioner_read(px, &portworx, &clone(px)).as_deref(),
        Some(px)
    );
    let ebs = "ebs.csi.aws.com";
    let aws = sc("c").provisioner("kubernetes.io/aws-ebs").build();
    assert_eq!(
        provisioner_read(ebs, &aws, &clone(ebs)).as_deref(),
        Some("kubernetes.io/aws-ebs")
    );
    let own = sc("c").build();
    assert_eq!(
        provisioner_read(DRIVER, &own, &clone(DRIVER)).as_deref(),
        Some(DRIVER)
    );
    // Where the decision stops first, nothing is read.
    assert_eq!(
        provisioner_read(px, &own, &clone(px)),
        None,
        "another driver's class"
    );
    let mut pv_exists = world(DRIVER, &own);
    pv_exists.pv_exists = true;
    let claim = clone(DRIVER);
    assert_eq!(
        source_to_read(&claim, &pv_exists.settings, &pv_exists.facts(&claim)),
        None,
        "its PV exists"
    );
    let bound = pvc("ns", "copy")
        .provisioner(DRIVER)
        .class("c")
        .volume_name("pv-1")
        .build();
    assert_eq!(provisioner_read(DRIVER, &own, &bound), None, "bound");
    let wffc = sc("c").binding_wffc().build();
    assert_eq!(
        provisioner_read(DRIVER, &wffc, &clone(DRIVER)),
        None,
        "no consumer yet"
    );
    let other_claim = pvc("ns", "copy")
        .provisioner("other.csi")
        .class("c")
        .build();
    assert_eq!(
        provisioner_read(DRIVER, &own, &other_claim),
        None,
        "another's claim"
    );
    let untranslatable = sc("c")
        .provisioner("kubernetes.io/aws-ebs")
        .param("zone", "us-east-1a")
        .allowed_topology([("topology.kubernetes.io/zone", vec!["us-east-1b"])])
        .build();
    assert_eq!(
        provisioner_read(ebs, &untranslatable, &clone(ebs)),
        None,
        "the plan reports the translation error first"
    );
}

/// A clone source being deleted is the data source's business before anything else: it waits
/// while a pending claim clones it, else its clone-protection finalizer comes off.
#[test]
fn a_clone_source_being_deleted_is_released_once_no_clone_is_pending() {
    let source = || {
        claim()
            .volume_name("pv-src")
            .finalizer(names::FINALIZER_CLONING_PROTECTION)
            .deleting()
            .build()
    };
    let w = World::new();
    let mut facts = w.facts(&source());
    facts.clones_pending = true;
    assert!(matches!(
        decide_claim(&source(), &w.settings, &facts),
        ClaimDecision::ReleaseCloneSource {
            clones_pending: true
        }
    ));
    facts.clones_pending = false;
    assert!(matches!(
        decide_claim(&source(), &w.settings, &facts),
        ClaimDecision::ReleaseCloneSource {
            clones_pending: false
        }
    ));
    assert_eq!(
        w.ignore(claim().volume_name("pv-src").deleting()),
        IgnoreReason::ClaimDeleting,
        "without the finalizer, a claim being deleted like any other"
    );
}

#[test]
fn cross_namespace_data_source_needs_the_gate() {
    let c = claim().data_source_ref(None, "PersistentVolumeClaim", "src", Some("other"));
    assert_eq!(
        World::new().fail(c).to_string(),
        "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled"
    );
}

#[test]
fn normal_provision_with_volume_attributes_class() {
    let mut w = World::new();
    w.settings.controller.modify_volume = true;
    w.vac = Some(vac("gold").param("iops", "3000").build());
    let plan = w.provision(claim().vac("gold"));
    assert_eq!(plan.request.mutable_parameters["iops"], "3000");
    assert_eq!(plan.pv.volume_attributes_class.as_deref(), Some("gold"));
}

#[test]
fn normal_provision_with_volume_attributes_class_but_feature_gate_is_disabled() {
    let mut w = World::new();
    w.settings.volume_attributes_class = false;
    let plan = w.provision(claim().vac("gold"));
    assert!(plan.request.mutable_parameters.is_empty());
    assert_eq!(plan.pv.volume_attributes_class, None);
}

#[test]
fn fail_with_volume_attributes_class_cases() {
    let mut w = World::new();
    // "... but driver does not support MODIFY_VOLUME"
    assert_eq!(
        w.fail(claim().vac("gold")).to_string(),
        "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
    );
    w.settings.controller.modify_volume = true;
    // "... but VAC does not exist"
    w.vac_missing = true;
    assert_eq!(
        w.fail(claim().vac("gold")).to_string(),
        "volumeattributesclasses.storage.k8s.io \"gold\" not found"
    );
    // "... but driver name does not match"
    w.vac = Some(vac("gold").driver("other.csi").build());
    assert_eq!(
        w.fail(claim().vac("gold")).to_string(),
        format!(
            "VAC gold referenced in PVC is for driver other.csi which does not match driver name {DRIVER}"
        )
    );
}

#[test]
fn distributed_right_node_selected() {
    let mut w = World::new();
    w.settings.node = Some(NodeMode {
        me: NodeIdentity {
            name: "n1".to_owned(),
            segments: Default::default(),
        },
        immediate_binding: true,
    });
    w.selected_node_uid = Some("uid-n1".to_owned());
    let plan = w.provision(claim().selected_node("n1"));
    assert_eq!(
        plan.pv.node,
        Some(("n1".to_owned(), Some("uid-n1".to_owned())))
    );
    // "distributed, wrong node selected": silent.
    assert_eq!(
        w.ignore(claim().selected_node("n2")),
        IgnoreReason::NotThisNode(NotOwned::SelectedOtherNode("n2".to_owned()))
    );
    // "distributed, no node selected": Immediate class → compete; otherwise not ours.
    assert!(matches!(
        w.decide(claim()),
        ClaimDecision::Ignore(IgnoreReason::NotThisNode(NotOwned::NotImmediateBinding))
    ));
    let w = w.class(sc("fast").binding_immediate());
    assert!(matches!(w.decide(claim()), ClaimDecision::Compete(_)));
}

#[test]
fn fail_with_selected_node_but_node_does_not_exist() {
    let w = World::new().topology().class(sc("fast").binding_wffc());
    match w.decide(claim().selected_node("gone")) {
        ClaimDecision::ClearSelectedNode(reason) => {
            assert_eq!(reason.event_reason(), names::EVENT_PROVISIONING_FAILED);
            assert_eq!(
                reason.message(),
                r#"failed to get selected CSINode gone: csinode.storage.k8s.io "gone" not found"#
            );
        }
        other => panic!("expected ClearSelectedNode, got {other:?}"),
    }
}

#[test]
fn selected_node_without_our_driver_is_cleared() {
    let mut w = World::new().class(sc("fast").binding_wffc());
    w.selected_node_driver = CsiNodeLookup::LacksDriver;
    match w.decide(claim().selected_node("n9")) {
        ClaimDecision::ClearSelectedNode(reason) => {
            assert_eq!(reason.event_reason(), names::EVENT_SELECTED_NODE_CLEARED);
            assert!(reason.message().contains("n9"));
        }
        other => panic!("expected ClearSelectedNode, got {other:?}"),
    }
}

#[test]
fn delayed_binding_waits_for_the_scheduler_then_uses_the_node_topology() {
    let mut w = World::new().topology().class(sc("fast").binding_wffc());
    assert_eq!(w.ignore(claim()), IgnoreReason::WaitingForFirstConsumer);
    w.view = StaticTopology {
        csinodes: vec![Arc::new(
            csinode("n1").driver(DRIVER, "id-1", [ZONE]).build(),
        )],
        nodes: vec![Arc::new(node("n1").label(ZONE, "z1").build())],
    };
    let plan = w.provision(claim().selected_node("n1"));
    let req = plan.request.accessibility_requirements.as_ref().unwrap();
    assert_eq!(req.requisite.len(), 1);
    assert_eq!(req.requisite[0].segments[ZONE], "z1");
    assert!(plan.may_reschedule);
    assert!(plan.pv.topology);
    // Topology errors other than a missing CSINode are retried, with upstream's wrapper.
    w.view.nodes.clear();
    let err = w.fail(claim().selected_node("n1"));
    assert!(err.to_string().starts_with(
        "error generating accessibility requirements: topology labels from selected node map[]"
    ));
}

#[test]
fn claims_of_other_provisioners_are_ignored_silently() {
    let w = World::new();
    assert_eq!(
        w.ignore(claim().provisioner("other.csi")),
        IgnoreReason::NotOurs(Some("other.csi".to_owned()))
    );
    assert_eq!(
        w.ignore(pvc("ns", "data").class("fast")),
        IgnoreReason::NotOurs(None)
    );
    // The beta annotation and the migrated-to annotation also make a claim ours.
    assert!(matches!(
        w.decide(
            pvc("ns", "data")
                .uid(UID)
                .beta_provisioner(DRIVER)
                .class("fast")
        ),
        ClaimDecision::Provision(_)
    ));
    // Migrated to us, but naming an in-tree plugin our driver did not take over: upstream's
    // library knows no such provisioner.
    assert_eq!(
        w.ignore(
            pvc("ns", "data")
                .uid(UID)
                .provisioner("kubernetes.io/aws-ebs")
                .annotation(names::ANN_MIGRATED_TO, DRIVER)
                .class("fast")
        ),
        IgnoreReason::NotOurs(Some("kubernetes.io/aws-ebs".to_owned()))
    );
}

/// Issue 31, upstream's TestProvisionWithMigration: a class of the in-tree plugin our driver
/// took over is translated (the request gets the CSI parameters) and the PV is written back in
/// in-tree form; claims annotated for the driver, or for the plugin and migrated to the driver,
/// are ours; one annotated only for the plugin, or migrated elsewhere, is not.
#[test]
fn a_migrated_in_tree_class_is_translated_and_its_pv_written_back_in_tree() {
    const EBS: &str = "ebs.csi.aws.com";
    const IN_TREE: &str = "kubernetes.io/aws-ebs";
    let mut w = World::new().class(
        sc("gp2")
            .provisioner(IN_TREE)
            .param("type", "gp2")
            .param("fsType", "ext4")
            .param("zone", "us-east-1a"),
    );
    w.settings.driver = EBS.to_owned();
    w.settings.topology = true;
    let base = || pvc("ns", "data").uid(UID).class("gp2");
    for claim in [
        base().beta_provisioner(EBS),
        base().provisioner(EBS),
        base()
            .beta_provisioner(IN_TREE)
            .annotation(names::ANN_MIGRATED_TO, EBS),
        base()
            .beta_provisioner(EBS)
            .annotation(names::ANN_MIGRATED_TO, EBS),
    ] {
        let plan = w.provision(claim);
        assert_eq!(
            plan.request.parameters.get("type").map(String::as_str),
            Some("gp2")
        );
        assert!(
            !plan.request.parameters.contains_key("zone"),
            "zone became topology"
        );
        let cap = &plan.request.volume_capabilities[0];
        let Some(crate::csi::v1::volume_capability::AccessType::Mount(m)) = &cap.access_type else {
            panic!("a mount volume");
        };
        assert_eq!(
            m.fs_type, "ext4",
            "fsType moved to csi.storage.k8s.io/fstype, then used"
        );
        let requisite = &plan
            .request
            .accessibility_requirements
            .as_ref()
            .unwrap()
            .requisite;
        assert_eq!(
            requisite[0]
                .segments
                .get("topology.ebs.csi.aws.com/zone")
                .map(String::as_str),
            Some("us-east-1a")
        );
        assert_eq!(plan.pv.in_tree, Some(crate::migration::Plugin::AwsEbs));
        assert_eq!(plan.pv.provisioned_by, IN_TREE);
    }
    for claim in [
        base()
            .beta_provisioner(IN_TREE)
            .annotation(names::ANN_MIGRATED_TO, "foo"),
        base()
            .beta_provisioner("foo")
            .annotation(names::ANN_MIGRATED_TO, "foo"),
        base().beta_provisioner(IN_TREE),
    ] {
        assert!(matches!(
            w.decide(claim),
            ClaimDecision::Ignore(IgnoreReason::NotOurs(_))
        ));
    }
    // zone and allowedTopologies together: upstream's translation error.
    let w = {
        let mut w = World::new().class(
            sc("gp2")
                .provisioner(IN_TREE)
                .param("zone", "us-east-1a")
                .allowed_topology([("topology.kubernetes.io/zone", vec!["us-east-1b"])]),
        );
        w.settings.driver = EBS.to_owned();
        w
    };
    assert_eq!(
        w.fail(base().provisioner(EBS)).to_string(),
        "failed to translate storage class: cannot simultaneously set allowed topologies and zone/zones parameters"
    );
}

#[test]
fn bound_and_deleting_claims_are_left_alone() {
    let w = World::new();
    assert_eq!(
        w.ignore(claim().volume_name("pv-static")),
        IgnoreReason::AlreadyBound("pv-static".to_owned())
    );
    assert_eq!(w.ignore(claim().deleting()), IgnoreReason::ClaimDeleting);
}

#[test]
fn class_problems_name_the_class_and_the_fix() {
    let mut w = World::new();
    w.class = None;
    let err = w.fail(claim());
    assert_eq!(
        err.to_string(),
        "storageclass.storage.k8s.io \"fast\" not found: create the StorageClass or correct spec.storageClassName of the claim"
    );
    assert!(!err.follows_provisioning_event());
    assert!(matches!(
        w.fail(pvc("ns", "data").uid(UID).provisioner(DRIVER)),
        PlanError::NoClassName { .. }
    ));
    let w = World::new().class(sc("fast").provisioner("other.csi"));
    assert_eq!(
        w.fail(claim()).to_string(),
        format!(
            "StorageClass \"fast\" is provisioned by \"other.csi\", not by \"{DRIVER}\": the claim's storage-provisioner annotation and its class disagree; correct spec.storageClassName"
        )
    );
    // The beta class annotation wins over spec.storageClassName.
    let plan = World::new()
        .class(sc("beta"))
        .provision(claim().beta_class("beta"));
    assert_eq!(plan.pv.class_name, "beta");
}

#[test]
fn an_existing_pv_stops_provisioning() {
    let mut w = World::new();
    w.pv_exists = true;
    assert_eq!(
        w.ignore(claim()),
        IgnoreReason::PvExists(format!("pvc-{UID}"))
    );
}

#[test]
fn bad_parameters_and_sizes_fail_before_any_call() {
    let w = World::new().class(sc("fast").param("csi.storage.k8s.io/typo", "x"));
    assert_eq!(
        w.fail(claim()).to_string(),
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/typo\" with reserved namespace csi.storage.k8s.io/"
    );
    let err = World::new().fail(claim().request("ten gigs"));
    assert!(err.to_string().contains("spec.resources.requests.storage"));
}

#[test]
fn missing_controller_capabilities_fail_with_upstream_text() {
    let mut w = World::new();
    w.settings.controller.create_delete_volume = false;
    assert_eq!(
        w.fail(claim()).to_string(),
        "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported"
    );
    w.settings.plugin.controller_service = false;
    assert_eq!(
        w.fail(claim()).to_string(),
        "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported"
    );
}

// === Durable intent ===

fn with_intent(c: PvcBuilder, name: &str) -> PvcBuilder {
    c.finalizer(names::FINALIZER_PROVISIONING_INTENT)
        .annotation(names::ANN_INTENT_VOLUME_NAME, name)
}

#[test]
fn another_drivers_intent_is_left_to_its_own_sidecar() {
    // Every driver running this sidecar writes the same finalizer: acting on another driver's
    // claim here would replay its CreateVolume against our driver (the claim-record store does not
    // take in other drivers' records either).
    let w = World::new();
    let foreign =
        || with_intent(pvc("ns", "data").uid(UID).provisioner("other.csi"), "pvc-x").class("fast");
    assert_eq!(
        w.ignore(foreign()),
        IgnoreReason::NotOurs(Some("other.csi".to_owned()))
    );
    for c in [foreign().deleting(), foreign().volume_name("elsewhere")] {
        assert!(matches!(w.decide(c), ClaimDecision::Ignore(_)));
    }
}

#[test]
fn pending_claim_with_intent_retries_with_the_recorded_name() {
    let mut w = World::new();
    // A changed prefix must not fork the claim into a second volume.
    w.settings.volume_name_prefix = "new".to_owned();
    let plan = w.provision(with_intent(claim(), "pvc-old"));
    assert_eq!(plan.volume_name, "pvc-old");
    assert_eq!(plan.request.name, "pvc-old");
}

#[test]
fn claims_that_no_longer_want_their_recorded_volume_are_the_resolvers() {
    // Deleted, or bound (to its volume or another PV): the intent log's resolver cleans up,
    // whichever store holds the record; the claim decision only leaves them alone.
    let w = World::new();
    assert_eq!(
        w.ignore(with_intent(claim(), "pvc-x").deleting()),
        IgnoreReason::ClaimDeleting
    );
    assert_eq!(
        w.ignore(with_intent(claim(), "pvc-x").volume_name("pv-static")),
        IgnoreReason::AlreadyBound("pv-static".to_owned())
    );
}

#[test]
fn node_mode_keeps_the_selected_node_of_a_recorded_intent_even_when_its_driver_is_missing() {
    // A CreateVolume was sent for that node (perhaps before a restart lost the in-memory pin).
    // Controller mode may clear it: the same driver answers the same name with the same volume.
    let mut w = World::new().topology().class(sc("fast").binding_wffc());
    w.selected_node_driver = CsiNodeLookup::LacksDriver;
    let in_flight = || with_intent(claim(), &format!("pvc-{UID}")).selected_node("gone");
    assert!(matches!(
        w.decide(in_flight()),
        ClaimDecision::ClearSelectedNode(_)
    ));

    // Node mode: each node has its own backend, so another node would create a second volume.
    // The instance that checks other nodes' claims leaves it to the node's instance.
    w.settings.node = Some(NodeMode {
        me: NodeIdentity {
            name: "n1".to_owned(),
            segments: Default::default(),
        },
        immediate_binding: true,
    });
    assert_eq!(
        w.ignore(in_flight()),
        IgnoreReason::NotThisNode(NotOwned::SelectedOtherNode("gone".to_owned()))
    );
    assert!(matches!(
        w.decide(claim().selected_node("gone")),
        ClaimDecision::ClearSelectedNode(_)
    ));
    // No CSINode at all: maybe the node is gone for good, which the shell confirms first.
    w.selected_node_driver = CsiNodeLookup::NotFound;
    assert!(matches!(
        w.decide(in_flight()),
        ClaimDecision::ClearSelectedNode(ClearReason::NodeGone { node, volume_name })
            if node == "gone" && volume_name == format!("pvc-{UID}")
    ));
}

#[test]
fn plan_error_states_follow_upstream() {
    assert_eq!(PlanError::Selector.state(), ProvisioningState::Finished);
    assert_eq!(
        PlanError::VacLookupFailed("x".to_owned()).state(),
        ProvisioningState::NoChange
    );
}

#[test]
fn a_pinned_requirement_is_sent_again_even_when_the_node_is_gone() {
    let mut w = World::new().topology().class(sc("fast").binding_wffc());
    w.view = StaticTopology {
        csinodes: vec![Arc::new(
            csinode("n1").driver(DRIVER, "id-1", [ZONE]).build(),
        )],
        nodes: vec![Arc::new(node("n1").label(ZONE, "z1").build())],
    };
    let first = w.provision(claim().selected_node("n1"));
    // The node and its CSINode disappear while CreateVolume may still be running.
    w.view = StaticTopology::default();
    w.pinned = first.request.accessibility_requirements.clone();
    let retry = w.provision(claim().selected_node("n1"));
    assert_eq!(
        retry.request.accessibility_requirements,
        first.request.accessibility_requirements
    );
}

// === What the shell reads for a claim ===

#[test]
fn the_volume_attributes_class_is_read_only_for_claims_still_to_provision() {
    let world = World::new();
    let settings = &world.settings;
    let pending = pvc("ns", "a").vac("gold").build();
    assert_eq!(vac_to_look_up(&pending, settings), Some("gold"));
    let bound = pvc("ns", "a").vac("gold").volume_name("pv-1").build();
    assert_eq!(
        vac_to_look_up(&bound, settings),
        None,
        "a bound claim needs no parameters"
    );
    let bound_with_intent = pvc("ns", "a")
        .vac("gold")
        .volume_name("pv-1")
        .finalizer(crate::names::FINALIZER_PROVISIONING_INTENT)
        .build();
    assert_eq!(
        vac_to_look_up(&bound_with_intent, settings),
        None,
        "the resolver cleans up from the recorded request, without the class"
    );
    let gate_off = ProvisionSettings {
        volume_attributes_class: false,
        ..settings.clone()
    };
    assert_eq!(vac_to_look_up(&pending, &gate_off), None);
    assert_eq!(
        vac_to_look_up(&pvc("ns", "a").vac("").build(), settings),
        None
    );
}

#[test]
fn the_selected_node_is_checked_only_by_the_checker_and_never_while_a_requirement_is_pinned() {
    let selected = pvc("ns", "a").selected_node("n1").build();
    assert_eq!(
        selected_node_to_check(&selected, false, || true),
        Some("n1")
    );
    assert_eq!(selected_node_to_check(&selected, false, || false), None);
    assert_eq!(selected_node_to_check(&selected, true, || true), None);
    let mut asked = false;
    let unselected = pvc("ns", "a").build();
    assert_eq!(
        selected_node_to_check(&unselected, false, || {
            asked = true;
            true
        }),
        None
    );
    assert!(!asked, "the ranking is computed only for a selected node");
}

// === Per-class retry policy (ours, `provision::classify`) ===

#[test]
fn a_claim_the_retry_policy_stopped_is_left_alone_until_the_stop_is_removed() {
    let w = World::new().class(sc("fast").annotation(names::ANN_MAX_PROVISIONING_FAILURES, "3"));
    let plan = w.provision(claim());
    assert_eq!(
        (plan.max_failures, plan.class_name.as_str()),
        (Some(3), "fast")
    );
    let stopped = claim().annotation(names::ANN_PROVISIONING_STOPPED, "stopped after 3");
    assert_eq!(w.ignore(stopped), IgnoreReason::ProvisioningStopped);
    // A bad limit is warned about and changes nothing.
    let plan = World::new()
        .class(sc("fast").annotation(names::ANN_MAX_PROVISIONING_FAILURES, "many"))
        .provision(claim());
    assert_eq!(plan.max_failures, None);
    assert!(plan.warnings.iter().any(|w| w.contains("retries forever")));
}

// === Node mode: the capacity check before competing ===

/// Node `n1` in zone `a`, Immediate class `fast` with a parameter and an fsType, driver with
/// topology and GET_CAPACITY.
fn competing_world() -> World {
    let segments: HashMap<String, String> = [(ZONE.to_owned(), "a".to_owned())].into();
    let mut w = World::new().topology().class(
        sc("fast")
            .binding_immediate()
            .param("type", "ssd")
            .param("csi.storage.k8s.io/fstype", "xfs"),
    );
    w.settings.controller.get_capacity = true;
    w.view = StaticTopology::single_node("n1", DRIVER, "n1-id", &segments);
    w.settings.node = Some(NodeMode {
        me: NodeIdentity {
            name: "n1".to_owned(),
            segments,
        },
        immediate_binding: true,
    });
    w
}

fn capacity_check_of(w: &World, claim: PvcBuilder) -> Option<CapacityCheck> {
    match w.decide(claim) {
        ClaimDecision::Compete(check) => check,
        other => panic!("expected Compete, got {other:?}"),
    }
}

#[test]
fn competing_asks_this_nodes_driver_what_create_volume_would_ask() {
    let w = competing_world();
    let check = capacity_check_of(&w, claim().request("2Gi")).expect("a check");
    assert_eq!(check.required_bytes, 2 << 30);
    let [request] = check.requests.as_slice() else {
        panic!("one request per requisite topology: {:?}", check.requests);
    };
    // This node's segments, the class parameters without the reserved keys, the capabilities.
    assert_eq!(
        request
            .accessible_topology
            .as_ref()
            .map(|t| t.segments.clone()),
        Some([(ZONE.to_owned(), "a".to_owned())].into())
    );
    assert_eq!(
        request.parameters,
        HashMap::from([("type".to_owned(), "ssd".to_owned())])
    );
    match request.volume_capabilities[0].access_type.as_ref() {
        Some(AccessType::Mount(m)) => assert_eq!(m.fs_type, "xfs"),
        other => panic!("expected a mount capability, got {other:?}"),
    }
}

#[test]
fn nothing_is_asked_for_zero_bytes_a_driver_without_get_capacity_or_a_request_that_cannot_be_built()
{
    let w = competing_world();
    assert_eq!(capacity_check_of(&w, claim().no_request()), None);
    // A bad parameter: the claim's ProvisioningFailed comes once this node has it, as upstream.
    let bad = competing_world().class(
        sc("fast")
            .binding_immediate()
            .param("csi.storage.k8s.io/unknown", "x"),
    );
    assert_eq!(capacity_check_of(&bad, claim().request("1Gi")), None);
    let mut without = competing_world();
    without.settings.controller.get_capacity = false;
    assert_eq!(capacity_check_of(&without, claim().request("1Gi")), None);
}

#[test]
fn one_topology_with_room_is_enough_and_a_failed_call_does_not_stop_the_competition() {
    let check = CapacityCheck {
        required_bytes: 100,
        requests: vec![Default::default(), Default::default()],
    };
    assert_eq!(check.verdict(&[]), None);
    assert_eq!(check.verdict(&[Ok(99)]), None, "one topology left to ask");
    assert_eq!(
        check.verdict(&[Ok(99), Ok(0)]),
        Some(CapacityVerdict::NotEnough)
    );
    assert_eq!(
        check.verdict(&[Ok(99), Ok(100)]),
        Some(CapacityVerdict::Enough),
        "equal is enough"
    );
    assert_eq!(
        check.verdict(&[Err("rpc error: code = Unavailable desc = x".to_owned())]),
        Some(CapacityVerdict::CheckFailed(
            "rpc error: code = Unavailable desc = x".to_owned()
        ))
    );
}
