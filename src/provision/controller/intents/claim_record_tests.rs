use serde_json::json;

use super::*;
use crate::csi::v1::CreateVolumeRequest;

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
    // No request: the annotations these tests look at are the volume and the secret.
    let entry = Entry {
        volume: "pvc-1".to_owned(),
        namespace: "ns".to_owned(),
        claim: "data".to_owned(),
        uid: "u1".to_owned(),
        secret: secret.then(|| "ns/creds".to_owned()),
        id: None,
        request: ByteString(Vec::new()),
        retain: false,
    };
    intent_annotations(&entry)
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

#[test]
fn a_record_on_the_claim_holds_what_a_ledger_entry_holds() {
    let claim = crate::testing::pvc("ns", "data").uid("u1").build();
    let request = CreateVolumeRequest {
        name: "pvc-1".to_owned(),
        parameters: [("tier".to_owned(), "gold".to_owned())].into(),
        secrets: [("password".to_owned(), "hunter2".to_owned())].into(),
        ..CreateVolumeRequest::default()
    };
    let mut entry = Entry::new(
        &claim,
        &request,
        Some(&crate::model::secrets::SecretRef::new("creds", "vault")),
        true,
    );
    entry.id = Some("vol-7".to_owned());
    let mut recorded = crate::testing::pvc("ns", "data")
        .uid("u1")
        .finalizer(names::FINALIZER_PROVISIONING_INTENT);
    for (key, value) in intent_annotations(&entry) {
        if let Some(value) = value {
            recorded = recorded.annotation(key, &value);
        }
    }
    let read = entry_of(&recorded.build()).unwrap();
    assert_eq!(read, entry);
    let replay = read.request().unwrap();
    assert_eq!(replay.parameters["tier"], "gold");
    assert!(replay.secrets.is_empty(), "secrets never leave the process");
    // Without the finalizer there is no record, whatever the annotations say.
    let annotations_only = crate::testing::pvc("ns", "data")
        .annotation(names::ANN_INTENT_VOLUME_NAME, "pvc-1")
        .build();
    assert_eq!(entry_of(&annotations_only), None);
}

/// A record of a build that kept neither requests nor policies names no request to replay, and
/// its policy reads as Retain: the volume of its deleted claim is kept, never deleted unseen.
#[test]
fn a_record_written_before_requests_were_kept_reads_as_retain_with_nothing_to_replay() {
    let legacy = crate::testing::pvc("ns", "data")
        .uid("u1")
        .finalizer(names::FINALIZER_PROVISIONING_INTENT)
        .annotation(names::ANN_INTENT_VOLUME_NAME, "pvc-x")
        .build();
    let entry = entry_of(&legacy).unwrap();
    assert_eq!(entry.volume, "pvc-x");
    assert_eq!(entry.request(), None);
    assert!(entry.retain);
    assert!(entry.may_be_kept(false));
}

/// The mirror follows the claim watch: a record appears with its claim's event and goes with the
/// event of the same claim without it (the finalizer removed), and another driver's claim is
/// never mirrored, whatever it carries.
#[tokio::test]
async fn the_mirror_follows_the_watch_and_holds_only_our_driver_s_records() {
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let records = ClaimRecords::new(client, "d");
    let claim = |finalizers: &[&str], driver: &str| {
        Lean::new(PersistentVolumeClaim {
            metadata: meta(
                finalizers,
                &[
                    ("volume.kubernetes.io/storage-provisioner", driver),
                    (names::ANN_INTENT_VOLUME_NAME, "pvc-1"),
                ],
            ),
            ..PersistentVolumeClaim::default()
        })
    };
    records.observe_cached(&claim(&[names::FINALIZER_PROVISIONING_INTENT], "d"));
    let pending = records.pending();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].volume, "pvc-1");
    records.observe_cached(&claim(&[PROTECTION], "d"));
    assert!(
        records.pending().is_empty(),
        "record removed from the claim"
    );
    records.observe_cached(&claim(&[names::FINALIZER_PROVISIONING_INTENT], "other"));
    assert!(records.pending().is_empty(), "another driver's claim");
}
