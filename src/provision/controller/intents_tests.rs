//! The log's handles over a retired journal's entries (no ledger): what each way of forgetting
//! does to the entry, its count and its files.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use super::claim_record::ClaimRecords;
use super::ledger::Entry;
use super::{Forget, Held, IntentLog, Journal};
use crate::csi::v1::CreateVolumeRequest;
use crate::testing::pvc;

fn entry(volume: &str) -> Entry {
    let request = CreateVolumeRequest {
        name: volume.to_owned(),
        ..Default::default()
    };
    Entry::new(&pvc("ns", volume).build(), &request, None, false)
}

/// A log without a ledger holding `volumes` as a journal's entries read from one file in `dir`.
fn log_of(volumes: &[&str], dir: &std::path::Path) -> (IntentLog, Arc<AtomicI64>) {
    let file = dir.join("intents-0.json");
    std::fs::write(&file, "[]").unwrap();
    let count = Arc::new(AtomicI64::new(0));
    let journal = Journal::new(
        volumes.iter().map(|v| entry(v)).collect(),
        vec![file],
        count.clone(),
    );
    let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let claims = Arc::new(ClaimRecords::new(client, "driver"));
    (IntentLog::new(None, claims, journal), count)
}

#[tokio::test]
async fn a_journal_entry_goes_when_resolved_and_its_file_once_none_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let (log, count) = log_of(&["pvc-a", "pvc-b"], dir.path());
    assert_eq!(count.load(Ordering::Relaxed), 2);
    let pending = log.pending();
    assert!(pending.iter().all(|p| p.held == Held::Journal));
    let a = pending.iter().find(|p| p.entry.volume == "pvc-a").unwrap();
    let b = pending.iter().find(|p| p.entry.volume == "pvc-b").unwrap();

    // A learned id is seen by the next pass.
    log.set_id(a, "vol-a").await;
    let again = log.pending();
    let a_again = again.iter().find(|p| p.entry.volume == "pvc-a").unwrap();
    assert_eq!(a_again.entry.id.as_deref(), Some("vol-a"));

    // Vanished is about a claim record: the entry stays.
    log.forget(a, Forget::Vanished).await.unwrap();
    assert_eq!(log.pending().len(), 2);
    assert_eq!(count.load(Ordering::Relaxed), 2);

    // Its PV exists, then its volume deleted: each goes, and with the last the file.
    log.forget(a, Forget::Stale).await.unwrap();
    assert_eq!(count.load(Ordering::Relaxed), 1);
    assert!(dir.path().join("intents-0.json").exists());
    log.forget(b, Forget::Done).await.unwrap();
    assert!(log.pending().is_empty());
    assert_eq!(count.load(Ordering::Relaxed), 0);
    assert!(!dir.path().join("intents-0.json").exists());
    assert!(dir.path().join("intents-0.json.resolved").exists());
}

#[tokio::test]
async fn the_same_volume_twice_in_a_journal_is_one_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (log, count) = log_of(&["pvc-a", "pvc-a"], dir.path());
    assert_eq!(log.pending().len(), 1);
    assert_eq!(count.load(Ordering::Relaxed), 1);
}

/// Node mode: another node's claim record of the same name is that node's copy; forgetting it
/// leaves this node's journal entry to be resolved on its own.
#[tokio::test]
async fn another_nodes_record_of_the_same_name_leaves_the_journal_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (log, count) = log_of(&["pvc-a"], dir.path());
    let theirs = super::Pending {
        entry: entry("pvc-a"),
        held: Held::Claim,
    };
    // The claim write fails here (no API server); the journal is decided before it.
    let _ = log.forget(&theirs, Forget::Done).await;
    assert_eq!(log.pending().len(), 1);
    assert_eq!(count.load(Ordering::Relaxed), 1);
    assert!(dir.path().join("intents-0.json").exists());
}

#[tokio::test]
async fn a_journal_file_that_lists_nothing_is_renamed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (log, count) = log_of(&[], dir.path());
    assert!(log.pending().is_empty());
    assert_eq!(count.load(Ordering::Relaxed), 0);
    assert!(dir.path().join("intents-0.json.resolved").exists());
}
