//! What must hold at quiescence between the API server's objects and a driver's volumes, whatever
//! happened before: the no-leak rules of the provisioner, checked from the outside. Shared by the
//! fault suite, the end-to-end tests and the benchmark, so every one of them checks the same rules.
//!
//! Objects are taken as JSON (as `kubectl get -o json`, kube-sim's dump or any client serialises
//! them), so that the checker needs no Kubernetes types of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

use crate::store::VolumeRecord;

/// The deletion-protection finalizer every PV of the provisioner with reclaim policy Delete carries.
pub const PV_DELETION_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// What is checked: one driver's volumes and the cluster's objects.
#[derive(Debug, Clone, Copy)]
pub struct World<'a> {
    /// The CSI driver name (`spec.csi.driver` of its PVs).
    pub driver: &'a str,
    /// Every volume the driver holds (from one or several mock instances).
    pub volumes: &'a [VolumeRecord],
    /// PersistentVolumes.
    pub pvs: &'a [Value],
    /// PersistentVolumeClaims.
    pub pvcs: &'a [Value],
    /// Pods (a claim used by a pod may legitimately wait in Terminating).
    pub pods: &'a [Value],
    /// core/v1 Events.
    pub events: &'a [Value],
    /// Most Event objects one involved object may have (repeats aggregate into `count`).
    pub max_events_per_object: usize,
    /// Volume names that had two CreateVolume calls outstanding at once
    /// (`StateDump::concurrent_creates` of every driver instance).
    pub concurrent_creates: &'a [String],
    /// Every DeleteVolume the driver received: (volume id, Unix ms).
    pub delete_calls: &'a [(String, u64)],
    /// From the API server's history: the claim UID each volume handle's PV named, and when each
    /// claim UID was removed (Unix ms). Empty maps skip the check.
    pub volume_claims: &'a BTreeMap<String, String>,
    pub claim_removals: &'a BTreeMap<String, u64>,
    /// From the API server's history: the last reclaim policy each volume handle's PV had. A
    /// volume whose PV was Retain is the user's: never deleted, and no leak once its PV is gone.
    /// Empty skips both.
    pub volume_policies: &'a BTreeMap<String, String>,
    /// Volume names the provisioner reported keeping because it could not tell whether they are
    /// safe to delete: not leaks (the audit lists them).
    pub reported_kept: &'a BTreeSet<String>,
}

/// One broken rule, saying which objects break it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A backend volume no PV refers to: leaked.
    LeakedVolume { id: String, name: String },
    /// One backend volume under several PVs.
    SharedVolume { id: String, pvs: Vec<String> },
    /// Two backend volumes created under one name (CreateVolume was not idempotent for it).
    DuplicateName { name: String, ids: Vec<String> },
    /// A PV of the driver whose backend volume does not exist (deleted under it, or never made).
    LostVolume { pv: String, handle: String },
    /// A claim bound to a PV that does not exist or is bound to another claim.
    BoundClaimWithoutPv { claim: String, volume: String },
    /// A PV of the driver with reclaim policy Delete lacking the deletion-protection finalizer.
    MissingFinalizer { pv: String },
    /// An object with a deletion timestamp that nothing legitimately holds.
    StuckTerminating { kind: &'static str, name: String },
    /// More Event objects about one object than the bound.
    TooManyEvents { object: String, events: usize },
    /// Two CreateVolume calls for one volume name were outstanding at once.
    ConcurrentCreate { name: String },
    /// DeleteVolume was called while the claim the volume's PV was bound to still existed.
    DeletedWhileClaimed { id: String, claim_uid: String },
    /// DeleteVolume was called for a volume whose PV had reclaim policy Retain: the user's data.
    RetainedVolumeDeleted { id: String },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LeakedVolume { id, name } => {
                write!(f, "volume {id} (name {name}) has no PV: leaked")
            }
            Self::SharedVolume { id, pvs } => {
                write!(f, "volume {id} is used by several PVs: {pvs:?}")
            }
            Self::DuplicateName { name, ids } => {
                write!(f, "CreateVolume name {name} made several volumes: {ids:?}")
            }
            Self::LostVolume { pv, handle } => {
                write!(
                    f,
                    "PV {pv} refers to volume {handle}, which the driver does not hold"
                )
            }
            Self::BoundClaimWithoutPv { claim, volume } => {
                write!(
                    f,
                    "claim {claim} is bound to {volume}, which is missing or bound elsewhere"
                )
            }
            Self::MissingFinalizer { pv } => {
                write!(f, "PV {pv} (reclaim Delete) lacks {PV_DELETION_FINALIZER}")
            }
            Self::StuckTerminating { kind, name } => {
                write!(f, "{kind} {name} is stuck Terminating")
            }
            Self::TooManyEvents { object, events } => {
                write!(f, "{object} has {events} Event objects")
            }
            Self::ConcurrentCreate { name } => {
                write!(
                    f,
                    "two CreateVolume calls for {name} were outstanding at once"
                )
            }
            Self::DeletedWhileClaimed { id, claim_uid } => write!(
                f,
                "DeleteVolume {id} was called while its claim (UID {claim_uid}) still existed"
            ),
            Self::RetainedVolumeDeleted { id } => write!(
                f,
                "DeleteVolume {id} was called although its PV had reclaim policy Retain"
            ),
        }
    }
}

fn text<'v>(v: &'v Value, pointer: &str) -> &'v str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn deleting(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

fn claim_key(pvc: &Value) -> String {
    format!(
        "{}/{}",
        text(pvc, "/metadata/namespace"),
        text(pvc, "/metadata/name")
    )
}

/// Every rule broken in `world` (empty: all hold).
pub fn check(world: &World<'_>) -> Vec<Violation> {
    let mut out = Vec::new();
    let ours: Vec<&Value> = world
        .pvs
        .iter()
        .filter(|pv| text(pv, "/spec/csi/driver") == world.driver)
        .collect();

    // Volumes <-> PVs, one to one.
    let mut by_handle: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for pv in &ours {
        by_handle
            .entry(text(pv, "/spec/csi/volumeHandle"))
            .or_default()
            .push(text(pv, "/metadata/name").to_owned());
    }
    let held: BTreeSet<&str> = world.volumes.iter().map(|v| v.id.as_str()).collect();
    let kept = |v: &VolumeRecord| {
        world.volume_policies.get(&v.id).map(String::as_str) == Some("Retain")
            || world.reported_kept.contains(&v.name)
    };
    for volume in world.volumes {
        match by_handle.get(volume.id.as_str()) {
            None if kept(volume) => {}
            None => out.push(Violation::LeakedVolume {
                id: volume.id.clone(),
                name: volume.name.clone(),
            }),
            Some(pvs) if pvs.len() > 1 => out.push(Violation::SharedVolume {
                id: volume.id.clone(),
                pvs: pvs.clone(),
            }),
            Some(_) => {}
        }
    }
    let mut by_name: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for volume in world.volumes {
        by_name
            .entry(volume.name.as_str())
            .or_default()
            .push(volume.id.clone());
    }
    for (name, ids) in by_name {
        if ids.len() > 1 {
            out.push(Violation::DuplicateName {
                name: name.to_owned(),
                ids,
            });
        }
    }
    for pv in &ours {
        let handle = text(pv, "/spec/csi/volumeHandle");
        let name = text(pv, "/metadata/name").to_owned();
        if !held.contains(handle) {
            out.push(Violation::LostVolume {
                pv: name.clone(),
                handle: handle.to_owned(),
            });
        }
        let delete = text(pv, "/spec/persistentVolumeReclaimPolicy") == "Delete";
        let finalizers = pv
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if delete && !finalizers.iter().any(|f| f == PV_DELETION_FINALIZER) {
            out.push(Violation::MissingFinalizer { pv: name });
        }
    }

    // Claims <-> PVs.
    let pv_by_name: BTreeMap<&str, &Value> = world
        .pvs
        .iter()
        .map(|pv| (text(pv, "/metadata/name"), pv))
        .collect();
    let live_claims: BTreeSet<String> = world.pvcs.iter().map(claim_key).collect();
    for pvc in world.pvcs {
        let volume = text(pvc, "/spec/volumeName");
        if text(pvc, "/status/phase") != "Bound" || volume.is_empty() {
            continue;
        }
        let bound_here = pv_by_name
            .get(volume)
            .is_some_and(|pv| text(pv, "/spec/claimRef/uid") == text(pvc, "/metadata/uid"));
        if !bound_here {
            out.push(Violation::BoundClaimWithoutPv {
                claim: claim_key(pvc),
                volume: volume.to_owned(),
            });
        }
    }

    // Nothing Terminating without a reason to wait.
    let used_claims: BTreeSet<String> = world
        .pods
        .iter()
        .flat_map(|pod| {
            let ns = text(pod, "/metadata/namespace").to_owned();
            pod.pointer("/spec/volumes")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(move |v| {
                    let claim = v.pointer("/persistentVolumeClaim/claimName")?.as_str()?;
                    Some(format!("{ns}/{claim}"))
                })
        })
        .collect();
    for pvc in world.pvcs.iter().filter(|pvc| deleting(pvc)) {
        if !used_claims.contains(&claim_key(pvc)) {
            out.push(Violation::StuckTerminating {
                kind: "PersistentVolumeClaim",
                name: claim_key(pvc),
            });
        }
    }
    for pv in world.pvs.iter().filter(|pv| deleting(pv)) {
        // pv-protection rightly holds a PV deleted before its still-existing claim (KEP-2644).
        let claim = format!(
            "{}/{}",
            text(pv, "/spec/claimRef/namespace"),
            text(pv, "/spec/claimRef/name")
        );
        if !live_claims.contains(&claim) {
            out.push(Violation::StuckTerminating {
                kind: "PersistentVolume",
                name: text(pv, "/metadata/name").to_owned(),
            });
        }
    }

    // Events stay bounded.
    let mut per_object: BTreeMap<String, usize> = BTreeMap::new();
    for event in world.events {
        let object = format!(
            "{} {}/{}",
            text(event, "/involvedObject/kind"),
            text(event, "/involvedObject/namespace"),
            text(event, "/involvedObject/name")
        );
        *per_object.entry(object).or_default() += 1;
    }
    for (object, events) in per_object {
        if events > world.max_events_per_object {
            out.push(Violation::TooManyEvents { object, events });
        }
    }
    // A DeleteVolume sent before the claim was removed (or while it still exists) is data loss.
    let mut reported = BTreeSet::new();
    for (id, at) in world.delete_calls {
        let Some(uid) = world.volume_claims.get(id) else {
            continue;
        };
        let removed = world.claim_removals.get(uid);
        if removed.is_none_or(|removed| removed > at) && reported.insert(id) {
            out.push(Violation::DeletedWhileClaimed {
                id: id.clone(),
                claim_uid: uid.clone(),
            });
        }
    }
    let mut retained = BTreeSet::new();
    for (id, _) in world.delete_calls {
        if world.volume_policies.get(id).map(String::as_str) == Some("Retain")
            && retained.insert(id)
        {
            out.push(Violation::RetainedVolumeDeleted { id: id.clone() });
        }
    }
    out.extend(
        world
            .concurrent_creates
            .iter()
            .map(|name| Violation::ConcurrentCreate { name: name.clone() }),
    );
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const DRIVER: &str = "mock.csi.rs";

    fn volume(id: &str, name: &str) -> VolumeRecord {
        VolumeRecord {
            id: id.into(),
            name: name.into(),
            capacity_bytes: 1,
            node: "n".into(),
            segment: BTreeMap::new(),
            parameters: BTreeMap::new(),
            mutable_parameters: BTreeMap::new(),
            content_source: None,
            secret_keys: Vec::new(),
            volume_context: BTreeMap::new(),
            seq: 0,
        }
    }

    fn pv(name: &str, handle: &str, claim_uid: &str) -> Value {
        json!({
            "metadata": {"name": name, "finalizers": [PV_DELETION_FINALIZER]},
            "spec": {
                "csi": {"driver": DRIVER, "volumeHandle": handle},
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"namespace": "default", "name": "data", "uid": claim_uid}
            }
        })
    }

    fn pvc(name: &str, uid: &str, volume: &str) -> Value {
        json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"volumeName": volume},
            "status": {"phase": "Bound"}
        })
    }

    fn world<'a>(
        volumes: &'a [VolumeRecord],
        pvs: &'a [Value],
        pvcs: &'a [Value],
        events: &'a [Value],
    ) -> World<'a> {
        World {
            driver: DRIVER,
            volumes,
            pvs,
            pvcs,
            pods: &[],
            events,
            max_events_per_object: 2,
            concurrent_creates: &[],
            delete_calls: &[],
            volume_claims: &EMPTY_CLAIMS,
            claim_removals: &EMPTY_REMOVALS,
            volume_policies: &EMPTY_CLAIMS,
            reported_kept: &EMPTY_KEPT,
        }
    }

    static EMPTY_KEPT: BTreeSet<String> = BTreeSet::new();

    /// Issue 29: the volume of a Retain PV is the user's. Deleting it is a violation; keeping it
    /// once its PV is gone (deleted by an admin) is not a leak, nor is a volume the provisioner
    /// reported keeping.
    #[test]
    fn a_retained_volume_is_never_deleted_and_never_a_leak() {
        let policies = BTreeMap::from([
            ("v1".to_owned(), "Retain".to_owned()),
            ("v2".to_owned(), "Delete".to_owned()),
        ]);
        let kept = BTreeSet::from(["pvc-3".to_owned()]);
        let volumes = [
            volume("v1", "pvc-1"),
            volume("v2", "pvc-2"),
            volume("v3", "pvc-3"),
        ];
        let calls = [("v1".to_owned(), 5), ("v2".to_owned(), 6)];
        let w = World {
            volume_policies: &policies,
            reported_kept: &kept,
            delete_calls: &calls,
            ..world(&volumes, &[], &[], &[])
        };
        assert_eq!(
            check(&w),
            [
                Violation::LeakedVolume {
                    id: "v2".into(),
                    name: "pvc-2".into()
                },
                Violation::RetainedVolumeDeleted { id: "v1".into() }
            ]
        );
    }

    static EMPTY_CLAIMS: BTreeMap<String, String> = BTreeMap::new();
    static EMPTY_REMOVALS: BTreeMap<String, u64> = BTreeMap::new();

    #[test]
    fn a_delete_volume_before_its_claim_was_removed_is_a_violation() {
        let claims = BTreeMap::from([
            ("v1".to_owned(), "u1".to_owned()),
            ("v2".to_owned(), "u2".to_owned()),
            ("v3".to_owned(), "u3".to_owned()),
        ]);
        // u1 removed at 100, u2 at 300, u3 never.
        let removals = BTreeMap::from([("u1".to_owned(), 100), ("u2".to_owned(), 300)]);
        let calls = [
            ("v1".to_owned(), 150),
            ("v2".to_owned(), 200),
            ("v3".to_owned(), 400),
            ("v-no-pv".to_owned(), 10),
        ];
        let w = World {
            delete_calls: &calls,
            volume_claims: &claims,
            claim_removals: &removals,
            ..world(&[], &[], &[], &[])
        };
        let got = check(&w);
        assert_eq!(
            got,
            [
                Violation::DeletedWhileClaimed {
                    id: "v2".into(),
                    claim_uid: "u2".into()
                },
                Violation::DeletedWhileClaimed {
                    id: "v3".into(),
                    claim_uid: "u3".into()
                }
            ]
        );
    }

    #[test]
    fn two_outstanding_creates_for_one_name_are_a_violation() {
        let twice = ["pvc-1".to_owned()];
        let w = World {
            concurrent_creates: &twice,
            ..world(&[], &[], &[], &[])
        };
        assert_eq!(
            check(&w),
            [Violation::ConcurrentCreate {
                name: "pvc-1".into()
            }]
        );
    }

    #[test]
    fn a_matched_world_holds_every_rule() {
        let volumes = [volume("v1", "pvc-1")];
        let pvs = [pv("pvc-1", "v1", "u1")];
        let pvcs = [pvc("data", "u1", "pvc-1")];
        assert_eq!(check(&world(&volumes, &pvs, &pvcs, &[])), []);
    }

    #[test]
    fn leaks_losses_duplicates_and_sharing_are_each_named() {
        let volumes = [
            volume("v1", "pvc-1"),
            volume("v2", "pvc-2"),
            volume("v3", "pvc-2"),
        ];
        let pvs = [
            pv("pvc-1", "v1", "u1"),
            pv("pvc-1b", "v1", "u9"),
            pv("pvc-4", "v4", "u4"),
            pv("pvc-2", "v2", "u2"),
        ];
        let violations = check(&world(&volumes, &pvs, &[], &[]));
        assert!(violations.contains(&Violation::LeakedVolume {
            id: "v3".into(),
            name: "pvc-2".into()
        }));
        assert!(violations.contains(&Violation::SharedVolume {
            id: "v1".into(),
            pvs: vec!["pvc-1".into(), "pvc-1b".into()]
        }));
        assert!(violations.contains(&Violation::DuplicateName {
            name: "pvc-2".into(),
            ids: vec!["v2".into(), "v3".into()]
        }));
        assert!(violations.contains(&Violation::LostVolume {
            pv: "pvc-4".into(),
            handle: "v4".into()
        }));
    }

    #[test]
    fn claims_finalizers_terminating_objects_and_event_storms_are_checked() {
        let volumes = [volume("v1", "pvc-1"), volume("v2", "pvc-2")];
        let mut bare = pv("pvc-2", "v2", "u2");
        bare["metadata"]["finalizers"] = json!([]);
        bare["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        bare["spec"]["claimRef"]["name"] = json!("gone");
        let pvs = [pv("pvc-1", "v1", "u1"), bare];
        let mut stuck = pvc("stuck", "u3", "");
        stuck["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let pvcs = [pvc("data", "other-uid", "pvc-1"), stuck];
        let event = json!({"involvedObject": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "data"}});
        let events = [event.clone(), event.clone(), event];
        let violations = check(&world(&volumes, &pvs, &pvcs, &events));
        let text: Vec<String> = violations.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "PV pvc-2 (reclaim Delete) lacks external-provisioner.volume.kubernetes.io/finalizer",
                "claim default/data is bound to pvc-1, which is missing or bound elsewhere",
                "PersistentVolumeClaim default/stuck is stuck Terminating",
                "PersistentVolume pvc-2 is stuck Terminating",
                "PersistentVolumeClaim default/data has 3 Event objects",
            ]
        );
    }
}
