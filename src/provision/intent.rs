//! The durable provisioning intent on a claim (see the state machine in [`super::plan`]): its
//! annotations, who acts on it in node mode, and what cleaning it up takes.

use std::collections::BTreeMap;

use json_patch::jsonptr::Token;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::csi::v1::CreateVolumeRequest;
use crate::k8s::patch::{
    Step, add_op, annotation_path, guard, meta_path, pointer, remove_op, test_op, version_test,
};
use crate::model::meta::{has_finalizer, non_empty_annotation};
use crate::model::secrets::SecretRef;
use crate::names;

/// Intent annotations for a volume name and provisioner secret.
pub(crate) fn intent_annotations(
    volume_name: &str,
    secret: Option<&SecretRef>,
) -> BTreeMap<&'static str, Option<String>> {
    BTreeMap::from([
        (names::ANN_INTENT_VOLUME_NAME, Some(volume_name.to_owned())),
        (
            names::ANN_INTENT_SECRET_NAME,
            secret.map(|s| s.name.clone()),
        ),
        (
            names::ANN_INTENT_SECRET_NAMESPACE,
            secret.map(|s| s.namespace.clone()),
        ),
    ])
}

/// Every annotation the intent may carry.
pub(crate) const INTENT_ANNOTATIONS: [&str; 4] = [
    names::ANN_INTENT_VOLUME_NAME,
    names::ANN_INTENT_VOLUME_ID,
    names::ANN_INTENT_SECRET_NAME,
    names::ANN_INTENT_SECRET_NAMESPACE,
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
    let mut ops = Vec::new();
    // `add` of a missing list would replace one created meanwhile: such writes pin the version.
    let mut version_tested = false;
    let finalizers = meta.finalizers.as_deref().unwrap_or_default();
    if !finalizers
        .iter()
        .any(|f| f == names::FINALIZER_PROVISIONING_INTENT)
    {
        if meta.deletion_timestamp.is_some() {
            return Step::ObjectDeleting;
        }
        let ours = Value::String(names::FINALIZER_PROVISIONING_INTENT.to_owned());
        if finalizers.is_empty() {
            ops.extend(version_test(meta));
            version_tested = true;
            ops.push(add_op(meta_path("finalizers"), Value::Array(vec![ours])));
        } else {
            let list = finalizers.iter().cloned().map(Value::String).collect();
            ops.push(test_op(meta_path("finalizers"), Value::Array(list)));
            let end = pointer([
                Token::new("metadata"),
                Token::new("finalizers"),
                Token::new("-"),
            ]);
            ops.push(add_op(end, ours));
        }
    }
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
    if ops.is_empty() {
        return Step::AlreadyDone;
    }
    Step::Write(json_patch::Patch(
        guard(meta).into_iter().chain(ops).collect(),
    ))
}

/// The write that removes the intent finalizer and every intent annotation from the claim
/// described by `meta`: `test` + `remove` of our finalizer at its index, `remove` of each of our
/// annotations present. Nothing else of the claim is relied on.
pub(crate) fn intent_removal_step(meta: &ObjectMeta) -> Step {
    let mut ops = Vec::new();
    let finalizers = meta.finalizers.as_deref().unwrap_or_default();
    if let Some(i) = finalizers
        .iter()
        .position(|f| f == names::FINALIZER_PROVISIONING_INTENT)
    {
        let path = pointer([
            Token::new("metadata"),
            Token::new("finalizers"),
            Token::from(i),
        ]);
        let ours = Value::String(names::FINALIZER_PROVISIONING_INTENT.to_owned());
        ops.push(test_op(path.clone(), ours));
        ops.push(remove_op(path));
    }
    let current = meta.annotations.as_ref();
    for k in INTENT_ANNOTATIONS {
        if current.is_some_and(|a| a.contains_key(k)) {
            ops.push(remove_op(annotation_path(k)));
        }
    }
    if ops.is_empty() {
        return Step::AlreadyDone;
    }
    Step::Write(json_patch::Patch(
        guard(meta).into_iter().chain(ops).collect(),
    ))
}

/// A volume to delete because its claim no longer wants it.
#[derive(Debug, Clone)]
pub(crate) struct IntentCleanup {
    /// The intent's volume name.
    pub(crate) volume_name: String,
    /// The volume id, when CreateVolume's answer was recorded.
    pub(crate) volume_id: Option<String>,
    /// The provisioner secret recorded with the intent (for CreateVolume replay and DeleteVolume).
    pub(crate) secret: Option<SecretRef>,
    /// Without a volume id: the CreateVolume to replay (same name) to learn it. The driver answers
    /// with the existing volume, or creates it, which is then deleted just the same. A failed
    /// replay is judged by [`super::classify::replay_verdict`].
    pub(crate) replay: Option<CreateVolumeRequest>,
    /// Whether `replay` is the request the original call was built from (same class, same
    /// inputs); otherwise a minimal one (class gone or inputs no longer valid), whose refusal
    /// proves nothing.
    pub(crate) replay_is_exact: bool,
    /// Why the volume is no longer wanted.
    pub(crate) reason: CleanupReason,
}

/// Why an intent's volume is deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CleanupReason {
    /// The claim is being deleted.
    ClaimDeleted,
    /// The claim got bound to another PV.
    BoundElsewhere(String),
    /// The PV of the volume's name holds another volume (in node mode: another node's copy).
    PvOfAnotherVolume,
}

/// Whether the claim carries the provisioning intent.
pub(crate) fn has_intent(pvc: &PersistentVolumeClaim) -> bool {
    has_finalizer(&pvc.metadata, names::FINALIZER_PROVISIONING_INTENT)
}

/// The provisioner secret recorded with the intent, when both its annotations are set.
pub(super) fn intent_secret(pvc: &PersistentVolumeClaim) -> Option<SecretRef> {
    Some(SecretRef::new(
        non_empty_annotation(&pvc.metadata, names::ANN_INTENT_SECRET_NAME)?,
        non_empty_annotation(&pvc.metadata, names::ANN_INTENT_SECRET_NAMESPACE)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(finalizers: &[&str], annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some("data".into()),
            uid: Some("u1".into()),
            resource_version: Some("7".into()),
            finalizers: (!finalizers.is_empty())
                .then(|| finalizers.iter().map(|f| f.to_string()).collect()),
            annotations: (!annotations.is_empty()).then(|| {
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            ..ObjectMeta::default()
        }
    }

    /// Applies `step` to a claim whose metadata is `on`.
    fn apply(step: &Step, on: &ObjectMeta) -> Result<ObjectMeta, json_patch::PatchError> {
        let Step::Write(patch) = step else {
            panic!("expected a write, got {step:?}");
        };
        let mut doc = json!({ "metadata": on });
        json_patch::patch(&mut doc, &patch.0)?;
        Ok(serde_json::from_value(doc["metadata"].clone()).unwrap())
    }

    fn wanted(secret: bool) -> BTreeMap<&'static str, Option<String>> {
        intent_annotations(
            "pvc-1",
            secret.then(|| SecretRef::new("creds", "ns")).as_ref(),
        )
    }

    const PROTECTION: &str = "kubernetes.io/pvc-protection";
    const PROVISIONER: (&str, &str) = ("volume.kubernetes.io/storage-provisioner", "d");

    #[test]
    fn the_intent_is_added_next_to_other_finalizers_and_annotations() {
        let read = meta(&[PROTECTION], &[PROVISIONER]);
        let step = intent_write_step(&read, &wanted(true));
        // Someone else changed the status and another annotation meanwhile: still applies.
        let mut later = read.clone();
        later.resource_version = Some("9".into());
        later
            .annotations
            .as_mut()
            .unwrap()
            .insert("pv.kubernetes.io/bind-completed".into(), "yes".into());
        let after = apply(&step, &later).unwrap();
        assert_eq!(
            after.finalizers.unwrap(),
            vec![
                PROTECTION.to_string(),
                names::FINALIZER_PROVISIONING_INTENT.to_string()
            ]
        );
        let ann = after.annotations.unwrap();
        assert_eq!(ann[names::ANN_INTENT_VOLUME_NAME], "pvc-1");
        assert_eq!(ann[names::ANN_INTENT_SECRET_NAME], "creds");
        assert_eq!(ann[names::ANN_INTENT_SECRET_NAMESPACE], "ns");
        assert_eq!(ann["pv.kubernetes.io/bind-completed"], "yes");
        // Recording it again is nothing to do.
        let done = meta(
            &[PROTECTION, names::FINALIZER_PROVISIONING_INTENT],
            &[
                PROVISIONER,
                (names::ANN_INTENT_VOLUME_NAME, "pvc-1"),
                (names::ANN_INTENT_SECRET_NAME, "creds"),
                (names::ANN_INTENT_SECRET_NAMESPACE, "ns"),
            ],
        );
        assert_eq!(intent_write_step(&done, &wanted(true)), Step::AlreadyDone);
    }

    #[test]
    fn a_changed_finalizer_list_or_another_object_makes_the_intent_write_fail() {
        let read = meta(&[PROTECTION], &[PROVISIONER]);
        let step = intent_write_step(&read, &wanted(false));
        let mut changed = read.clone();
        changed.finalizers = Some(vec!["other".into(), PROTECTION.into()]);
        assert!(apply(&step, &changed).is_err());
        let mut replaced = read.clone();
        replaced.uid = Some("u2".into());
        assert!(apply(&step, &replaced).is_err());
    }

    #[test]
    fn a_claim_without_finalizers_or_annotations_gets_both_lists_at_its_version() {
        let read = meta(&[], &[]);
        let step = intent_write_step(&read, &wanted(false));
        let after = apply(&step, &read).unwrap();
        assert_eq!(
            after.finalizers.unwrap(),
            vec![names::FINALIZER_PROVISIONING_INTENT.to_string()]
        );
        assert_eq!(
            after.annotations.unwrap(),
            BTreeMap::from([(
                names::ANN_INTENT_VOLUME_NAME.to_string(),
                "pvc-1".to_string()
            )])
        );
        let mut later = read.clone();
        later.resource_version = Some("8".into());
        assert!(
            apply(&step, &later).is_err(),
            "would replace lists written meanwhile"
        );
    }

    #[test]
    fn a_stale_secret_annotation_is_removed_and_a_deleting_claim_gets_no_intent() {
        let read = meta(
            &[names::FINALIZER_PROVISIONING_INTENT],
            &[
                (names::ANN_INTENT_VOLUME_NAME, "pvc-1"),
                (names::ANN_INTENT_SECRET_NAME, "old"),
                (names::ANN_INTENT_SECRET_NAMESPACE, "ns"),
            ],
        );
        let after = apply(&intent_write_step(&read, &wanted(false)), &read).unwrap();
        assert_eq!(
            after.annotations.unwrap().into_keys().collect::<Vec<_>>(),
            vec![names::ANN_INTENT_VOLUME_NAME.to_string()]
        );
        let mut deleting = meta(&[PROTECTION], &[]);
        deleting.deletion_timestamp = Some(crate::testing::deletion_time());
        assert_eq!(
            intent_write_step(&deleting, &wanted(false)),
            Step::ObjectDeleting
        );
    }

    #[test]
    fn removal_takes_only_the_intent_away() {
        let read = meta(
            &[PROTECTION, names::FINALIZER_PROVISIONING_INTENT],
            &[
                PROVISIONER,
                (names::ANN_INTENT_VOLUME_NAME, "pvc-1"),
                (names::ANN_INTENT_VOLUME_ID, "vol-1"),
            ],
        );
        let step = intent_removal_step(&read);
        let mut later = read.clone();
        later.resource_version = Some("12".into());
        let after = apply(&step, &later).unwrap();
        assert_eq!(after.finalizers.unwrap(), vec![PROTECTION.to_string()]);
        assert_eq!(
            after.annotations.unwrap(),
            BTreeMap::from([(PROVISIONER.0.to_string(), PROVISIONER.1.to_string())])
        );
        // Our finalizer moved (someone removed the one before it): the test fails, no harm done.
        let mut moved = read.clone();
        moved.finalizers = Some(vec![names::FINALIZER_PROVISIONING_INTENT.into()]);
        assert!(apply(&step, &moved).is_err());
        assert_eq!(
            intent_removal_step(&meta(&[PROTECTION], &[PROVISIONER])),
            Step::AlreadyDone
        );
    }
}
