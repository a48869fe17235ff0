//! The claim record: intents on their claims when Leases are refused (and as an earlier run left
//! them), as a finalizer (the claim cannot go while a volume may exist without a PV) and
//! annotations. [`ClaimRecords`] mirrors them from the claim watch ([`ClaimRecords::observe`]), so
//! listing them costs no request. See docs/intent-ledger.md.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use json_patch::PatchOperation;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use crate::k8s::cache::Lean;
use crate::k8s::patch::{
    self, PatchError, PatchOutcome, Step, add_op, annotation_path, guard, meta_path, remove_op,
    version_test,
};
use crate::model::meta::{has_finalizer, non_empty_annotation};
use crate::names;
use crate::provision::controller::intents::ledger::Entry;
use crate::sync::lock;

/// The annotations that record `entry` on its claim (`None` removes a stale key).
pub(crate) fn intent_annotations(entry: &Entry) -> BTreeMap<&'static str, Option<String>> {
    let secret = entry.secret_ref();
    let request = (!entry.request.0.is_empty())
        .then(|| serde_json::to_value(&entry.request).ok())
        .flatten()
        .and_then(|v| v.as_str().map(str::to_owned));
    let mut wanted = BTreeMap::from([
        (names::ANN_INTENT_VOLUME_NAME, Some(entry.volume.clone())),
        (
            names::ANN_INTENT_SECRET_NAME,
            secret.as_ref().map(|s| s.name.clone()),
        ),
        (
            names::ANN_INTENT_SECRET_NAMESPACE,
            secret.map(|s| s.namespace),
        ),
        (names::ANN_INTENT_REQUEST, request),
        (
            names::ANN_INTENT_RETAIN,
            entry.retain.then(|| "true".to_owned()),
        ),
    ]);
    // A learned id is never taken away by a new attempt's record (which does not know it).
    if let Some(id) = &entry.id {
        wanted.insert(names::ANN_INTENT_VOLUME_ID, Some(id.clone()));
    }
    wanted
}

/// Every annotation the intent may carry.
pub(crate) const INTENT_ANNOTATIONS: [&str; 6] = [
    names::ANN_INTENT_VOLUME_NAME,
    names::ANN_INTENT_VOLUME_ID,
    names::ANN_INTENT_SECRET_NAME,
    names::ANN_INTENT_SECRET_NAMESPACE,
    names::ANN_INTENT_REQUEST,
    names::ANN_INTENT_RETAIN,
];

/// The write that records the intent (finalizer plus `wanted` annotations, `None` = remove) on
/// the claim described by `meta`. Its `test` ops cover only what it touches, so unrelated
/// concurrent writes (the PV controller's annotations and status) do not make it fail; a changed
/// finalizer list does. Adding the finalizer to a claim being deleted is refused by the API
/// server: [`Step::ObjectDeleting`].
pub(crate) fn intent_write_step(
    meta: &ObjectMeta,
    wanted: &BTreeMap<&'static str, Option<String>>,
) -> Step {
    let finalizer = patch::add_finalizer_step(meta, names::FINALIZER_PROVISIONING_INTENT);
    // `add` of a missing list would replace one created meanwhile: such writes pin the version
    // (the finalizer's write does when it creates the list).
    let version_tested = matches!(finalizer, Step::Write(_))
        && meta.finalizers.as_deref().unwrap_or_default().is_empty();
    let current = meta.annotations.clone().unwrap_or_default();
    let sets: BTreeMap<&str, &String> = wanted
        .iter()
        .filter_map(|(k, v)| Some((*k, v.as_ref()?)))
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .collect();
    let removes = wanted
        .iter()
        .filter(|(k, v)| v.is_none() && current.contains_key(**k))
        .map(|(k, _)| *k);
    let mut ops = Vec::new();
    if current.is_empty() && !sets.is_empty() {
        if !version_tested {
            ops.extend(version_test(meta));
        }
        let map = sets
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::String((*v).clone())))
            .collect();
        ops.push(add_op(meta_path("annotations"), Value::Object(map)));
    } else {
        for (k, v) in sets {
            ops.push(add_op(annotation_path(k), Value::String(v.clone())));
        }
    }
    for k in removes {
        ops.push(remove_op(annotation_path(k)));
    }
    with_finalizer_step(finalizer, meta, ops)
}

/// The write that removes the intent finalizer and every intent annotation from the claim
/// described by `meta`: `test` + `remove` of our finalizer at its index, `remove` of each of our
/// annotations present. Nothing else of the claim is relied on.
pub(crate) fn intent_removal_step(meta: &ObjectMeta) -> Step {
    let current = meta.annotations.as_ref();
    let ops = INTENT_ANNOTATIONS
        .iter()
        .filter(|k| current.is_some_and(|a| a.contains_key(**k)))
        .map(|k| remove_op(annotation_path(k)))
        .collect();
    let finalizer = patch::remove_finalizer_step(meta, names::FINALIZER_PROVISIONING_INTENT);
    with_finalizer_step(finalizer, meta, ops)
}

/// `ops` after the write of our finalizer (`finalizer`, guarded), else behind the guard of the
/// claim described by `meta`; nothing to write when there are none.
fn with_finalizer_step(finalizer: Step, meta: &ObjectMeta, ops: Vec<PatchOperation>) -> Step {
    match finalizer {
        Step::Write(mut patch) => {
            patch.0.extend(ops);
            Step::Write(patch)
        }
        Step::AlreadyDone if ops.is_empty() => Step::AlreadyDone,
        Step::AlreadyDone => Step::Write(json_patch::Patch(
            guard(meta).into_iter().chain(ops).collect(),
        )),
        // Adding the finalizer to a claim being deleted is refused by the API server.
        Step::ObjectDeleting => Step::ObjectDeleting,
    }
}

/// Whether the claim carries the intent finalizer.
pub(crate) fn has_record(pvc: &PersistentVolumeClaim) -> bool {
    has_finalizer(&pvc.metadata, names::FINALIZER_PROVISIONING_INTENT)
}

/// The intent recorded on `pvc`, if it carries one. A record without its request was written by a
/// build that kept neither requests nor reclaim policies (never released): its policy is taken as
/// Retain, the safe side, so the volume of its deleted claim is kept and reported.
pub(crate) fn entry_of(pvc: &PersistentVolumeClaim) -> Option<Entry> {
    if !has_record(pvc) {
        return None;
    }
    let meta = &pvc.metadata;
    let volume = non_empty_annotation(meta, names::ANN_INTENT_VOLUME_NAME)?.to_owned();
    let secret = non_empty_annotation(meta, names::ANN_INTENT_SECRET_NAMESPACE)
        .zip(non_empty_annotation(meta, names::ANN_INTENT_SECRET_NAME))
        .map(|(namespace, name)| format!("{namespace}/{name}"));
    let request = non_empty_annotation(meta, names::ANN_INTENT_REQUEST)
        .and_then(|text| serde_json::from_value::<ByteString>(Value::String(text.to_owned())).ok());
    let retain =
        request.is_none() || non_empty_annotation(meta, names::ANN_INTENT_RETAIN) == Some("true");
    Some(Entry {
        volume,
        namespace: meta.namespace.clone().unwrap_or_default(),
        claim: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        secret,
        id: non_empty_annotation(meta, names::ANN_INTENT_VOLUME_ID).map(str::to_owned),
        request: request.unwrap_or_default(),
        retain,
    })
}

/// The claim-record store: writes and the mirror of what the claims carry.
pub(crate) struct ClaimRecords {
    client: Client,
    /// Our driver: every driver running this sidecar writes the same finalizer.
    driver: String,
    /// Records by claim UID.
    mirror: Mutex<HashMap<String, Entry>>,
    /// Volumes this process recorded itself, until forgotten.
    recorded_here: Mutex<HashSet<String>>,
}

impl ClaimRecords {
    /// An empty store for claims of `driver`.
    pub(crate) fn new(client: Client, driver: &str) -> Self {
        Self {
            client,
            driver: driver.to_owned(),
            mirror: Mutex::new(HashMap::new()),
            recorded_here: Mutex::new(HashSet::new()),
        }
    }

    /// [`Self::observe`] for a cached claim, unpacked only when it mentions the record's
    /// finalizer: most claims never carry one, and their events then cost no parse.
    pub(crate) fn observe_cached(&self, claim: &Lean<PersistentVolumeClaim>) {
        if claim.mentions(names::FINALIZER_PROVISIONING_INTENT) {
            self.observe(&claim.full());
        } else {
            lock(&self.mirror).remove(claim.uid());
        }
    }

    /// Takes in the claim as the watch delivered it: its record (our driver's only), or none.
    pub(crate) fn observe(&self, pvc: &PersistentVolumeClaim) {
        let uid = pvc.uid().unwrap_or_default();
        let record = entry_of(pvc).filter(|_| crate::model::claim::is_ours(pvc, &self.driver));
        let mut mirror = lock(&self.mirror);
        match record {
            Some(record) => mirror.insert(uid, record),
            None => mirror.remove(&uid),
        };
    }

    /// Every record.
    pub(crate) fn pending(&self) -> Vec<Entry> {
        lock(&self.mirror).values().cloned().collect()
    }

    /// Whether this process recorded `volume` itself.
    pub(crate) fn recorded_here(&self, volume: &str) -> bool {
        lock(&self.recorded_here).contains(volume)
    }

    fn api(&self, namespace: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Writes the finalizer and `entry`'s annotations on `pvc` in one write
    /// ([`intent_write_step`]); nothing is written when they are there already. `false`: the
    /// claim is being deleted (or gone): nothing was started, nothing may be.
    pub(crate) async fn record(
        &self,
        pvc: &PersistentVolumeClaim,
        entry: &Entry,
    ) -> Result<bool, PatchError> {
        let wanted = intent_annotations(entry);
        let outcome = patch::patch_fresh(
            &self.api(&entry.namespace),
            pvc,
            "record provisioning intent",
            |meta| intent_write_step(meta, &wanted),
        )
        .await?;
        match outcome {
            PatchOutcome::Patched(fresh) | PatchOutcome::Unchanged(fresh) => {
                lock(&self.recorded_here).insert(entry.volume.clone());
                self.observe(&fresh);
                Ok(true)
            }
            PatchOutcome::Deleting(_) | PatchOutcome::Gone => Ok(false),
        }
    }

    /// Records the learned volume id on the claim (a retried clean-up then needs no replay).
    /// Best effort: without it the next attempt replays CreateVolume.
    pub(crate) async fn set_id(&self, entry: &Entry, id: &str) {
        // Only while the claim still carries the record.
        let step = |meta: &ObjectMeta| {
            if !has_finalizer(meta, names::FINALIZER_PROVISIONING_INTENT) {
                Step::AlreadyDone
            } else {
                patch::set_annotation_step(meta, names::ANN_INTENT_VOLUME_ID, id)
            }
        };
        if let Ok(PatchOutcome::Patched(fresh)) = patch::patch_fresh(
            &self.api(&entry.namespace),
            &seed(entry),
            "record volume id",
            step,
        )
        .await
        {
            self.observe(&fresh);
        }
    }

    /// Removes the finalizer and every intent annotation from the claim of `entry`.
    pub(crate) async fn forget(&self, entry: &Entry) -> Result<(), PatchError> {
        patch::patch_fresh(
            &self.api(&entry.namespace),
            &seed(entry),
            "remove provisioning intent",
            intent_removal_step,
        )
        .await?;
        lock(&self.recorded_here).remove(&entry.volume);
        // Not from the answer: removing the last finalizer of a deleted claim answers with the
        // object as last stored, which still shows the record.
        self.unmirror(entry);
        Ok(())
    }

    /// Drops the mirror's entry of `entry`'s claim.
    pub(crate) fn unmirror(&self, entry: &Entry) {
        let mut mirror = lock(&self.mirror);
        if mirror
            .get(&entry.uid)
            .is_some_and(|m| m.volume == entry.volume)
        {
            mirror.remove(&entry.uid);
        }
    }
}

/// A claim carrying only `entry`'s identity: without a resourceVersion it is read before any
/// write is computed ([`patch::patch_fresh`]).
fn seed(entry: &Entry) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(entry.claim.clone()),
            namespace: Some(entry.namespace.clone()),
            uid: Some(entry.uid.clone()),
            ..ObjectMeta::default()
        },
        ..PersistentVolumeClaim::default()
    }
}

#[cfg(test)]
#[path = "claim_record_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "claim_record_props_tests.rs"]
mod props_tests;
