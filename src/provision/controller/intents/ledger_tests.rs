use super::*;
use crate::testing::pvc;

impl Book {
    /// The entry of `volume`.
    pub(crate) fn get(&self, volume: &str) -> Option<&Entry> {
        self.entries.get(volume).map(|s| &s.entry)
    }

    /// Whether anything waits for a write: an unwritten entry or a prompt removal.
    pub(crate) fn has_uncommitted(&self) -> bool {
        self.prompt || self.entries.values().any(|s| !s.committed)
    }
}

fn request(name: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.to_owned(),
        parameters: [("type".to_owned(), "fast".to_owned())].into(),
        secrets: [("password".to_owned(), "hunter2".to_owned())].into(),
        ..CreateVolumeRequest::default()
    }
}

fn entry(volume: &str) -> Entry {
    Entry::new(
        &pvc("ns", volume).build(),
        &request(volume),
        Some(&SecretRef::new("creds", "vault")),
        false,
    )
}

/// Issue 29: a Retain class's entry whose claim and PV are gone is kept unless this process
/// recorded it (and so knows no PV was made); the flag survives the Lease's JSON, and entries
/// written before it existed read as Delete.
#[test]
fn a_retain_entry_read_from_an_earlier_process_may_be_a_kept_volume() {
    let mut e = entry("pvc-r");
    assert!(!e.may_be_kept(false));
    e.retain = true;
    assert!(e.may_be_kept(false));
    assert!(!e.may_be_kept(true));
    let text = serde_json::to_string(&e).unwrap();
    let back: Entry = serde_json::from_str(&text).unwrap();
    assert!(back.retain);
    let old = serde_json::to_string(&entry("pvc-d")).unwrap();
    assert!(!old.contains("retain"), "{old}");
    assert!(!serde_json::from_str::<Entry>(&old).unwrap().retain);
}

#[test]
fn an_entry_keeps_the_exact_request_but_never_its_secrets() {
    let e = entry("pvc-1");
    let stored = e.request().expect("decodes");
    assert_eq!(stored.name, "pvc-1");
    assert_eq!(stored.parameters["type"], "fast");
    assert!(stored.secrets.is_empty());
    assert_eq!(e.secret_ref(), Some(SecretRef::new("creds", "vault")));
    let text = encode(&[&e]);
    assert!(!text.contains("hunter2"), "{text}");
    assert_eq!(decode(&text).expect("round trip"), vec![e]);
    assert!(
        decode("{not json")
            .unwrap_err()
            .contains(crate::names::LEDGER_ENTRIES_ANNOTATION)
    );
}

#[test]
fn shard_names_round_trip() {
    assert_eq!(shard_name("my-driver", 3), "my-driver-intents-3");
    assert_eq!(shard_index("my-driver", "my-driver-intents-3"), Some(3));
    assert_eq!(shard_index("my-driver", "other-intents-3"), None);
    assert_eq!(shard_index("my-driver", "my-driver"), None);
}

#[test]
fn one_commit_carries_every_pending_entry_and_a_committed_one_needs_no_write() {
    let mut book = Book::default();
    assert!(book.record(entry("pvc-1")));
    assert!(book.record(entry("pvc-2")));
    let commit = book.take_commit(true);
    assert_eq!(commit.len(), 1, "both in one write");
    let written = decode(&commit[0].content).expect("valid");
    assert_eq!(written.len(), 2);
    book.committed(&commit[0], &written);
    assert!(!book.has_uncommitted());
    assert!(!book.is_dirty());
    assert!(!book.record(entry("pvc-1")));
    // A removal needs a write, but is not an uncommitted addition (it may wait).
    assert!(book.forget("pvc-1", Removal::Lazy));
    assert!(!book.forget("pvc-1", Removal::Lazy));
    assert!(book.is_dirty() && !book.has_uncommitted());
    assert_eq!(book.len(), 1);
}

#[test]
fn a_retained_volumes_removal_is_written_at_once_and_others_wait() {
    let mut book = Book::default();
    book.record(entry("pvc-1"));
    book.record(entry("pvc-2"));
    let commit = book.take_commit(true);
    let written = decode(&commit[0].content).expect("valid");
    book.committed(&commit[0], &written);
    assert!(book.forget("pvc-1", Removal::Lazy));
    assert!(!book.has_uncommitted(), "a Delete PV's removal may wait");
    assert!(book.forget("pvc-2", Removal::Prompt));
    assert!(book.has_uncommitted(), "a Retain PV's removal is due now");
    let commit = book.take_commit(true);
    assert_eq!(decode(&commit[0].content).expect("valid"), vec![]);
    assert!(!book.has_uncommitted());
    // A failed write of it waits for the next commit or the resolver's flush, which writes it.
    book.failed(commit[0].shard);
    assert!(book.is_dirty());
    let retried = book.take_commit(true);
    assert_eq!(decode(&retried[0].content).expect("valid"), vec![]);
}

#[test]
fn an_entry_changed_during_its_commit_stays_uncommitted() {
    let mut book = Book::default();
    book.record(entry("pvc-1"));
    let commit = book.take_commit(true);
    let written = decode(&commit[0].content).expect("valid");
    book.set_id("pvc-1", "vol-1");
    book.committed(&commit[0], &written);
    assert!(book.has_uncommitted(), "the id is not written yet");
    assert_eq!(
        book.get("pvc-1").and_then(|e| e.id.as_deref()),
        Some("vol-1")
    );
}

#[test]
fn a_failed_write_is_written_again() {
    let mut book = Book::default();
    book.record(entry("pvc-1"));
    let commit = book.take_commit(true);
    assert!(!book.is_dirty());
    book.failed(commit[0].shard);
    assert!(book.is_dirty() && book.has_uncommitted());
}

#[test]
fn shards_fill_up_to_their_size_limit_and_reuse_freed_room() {
    let mut book = Book::default();
    let per_shard = SHARD_BYTES / entry_bytes(&entry("pvc-00000"));
    assert!(per_shard > 300, "a burst fits in few shards: {per_shard}");
    for i in 0..=per_shard {
        book.record(entry(&format!("pvc-{i:05}")));
    }
    let commit = book.take_commit(true);
    assert_eq!(commit.len(), 2);
    assert!(commit[0].content.len() <= SHARD_BYTES);
    assert_eq!(decode(&commit[0].content).unwrap().len(), per_shard);
    assert_eq!(decode(&commit[1].content).unwrap().len(), 1);
    book.forget("pvc-00000", Removal::Lazy);
    book.take_commit(true);
    book.record(entry("pvc-new00"));
    let commit = book.take_commit(true);
    assert_eq!(commit.len(), 1);
    assert_eq!(commit[0].shard, 0, "freed room in the first shard is used");
}

#[test]
fn a_commit_for_new_intents_leaves_shards_changed_only_by_removals_for_later() {
    let mut book = Book::default();
    let per_shard = SHARD_BYTES / entry_bytes(&entry("pvc-00000"));
    for i in 0..=per_shard {
        book.record(entry(&format!("pvc-{i:05}")));
    }
    book.take_commit(true);
    // Removals in both shards, and a new intent that takes the room freed in shard 0.
    book.forget("pvc-00000", Removal::Lazy);
    book.forget(&format!("pvc-{per_shard:05}"), Removal::Lazy);
    book.record(entry("pvc-again"));
    assert!(book.has_uncommitted());
    let commit = book.take_commit(false);
    assert_eq!(
        commit.iter().map(|s| s.shard).collect::<Vec<_>>(),
        vec![0],
        "only the shard with the new intent is written"
    );
    let written = decode(&commit[0].content).unwrap();
    book.committed(&commit[0], &written);
    assert!(!book.has_uncommitted(), "no write is due now");
    assert!(
        book.is_dirty(),
        "shard 1's removal waits for the resolver's flush"
    );
    let commit = book.take_commit(true);
    assert_eq!(commit.iter().map(|s| s.shard).collect::<Vec<_>>(), vec![1]);
    assert!(!book.is_dirty());

    // A prompt removal is written with the next commit, whatever it is for.
    book.record(entry("pvc-more0"));
    book.take_commit(false);
    book.forget(&format!("pvc-{:05}", 1), Removal::Prompt);
    assert!(book.has_uncommitted(), "due now");
    assert_eq!(book.take_commit(false).len(), 1);
}

#[test]
fn loaded_and_foreign_entries_are_committed_and_a_duplicate_is_kept_once() {
    let book = Book::load(vec![
        (0, vec![entry("pvc-1"), entry("pvc-2")]),
        (1, vec![entry("pvc-2")]),
    ]);
    assert_eq!(book.len(), 2);
    assert!(!book.has_uncommitted());
    assert!(
        book.is_dirty(),
        "the shard that lost the duplicate is rewritten"
    );

    let mut book = Book::default();
    book.record(entry("pvc-1"));
    book.take_commit(true);
    book.merge_foreign(0, vec![entry("pvc-1"), entry("pvc-9")]);
    assert_eq!(book.len(), 2);
    assert!(book.get("pvc-9").is_some());
    assert!(book.is_dirty(), "the merged shard is written again");
}

#[test]
fn a_stale_entry_is_dropped_without_a_write_of_its_own_and_left_out_of_the_next_one() {
    let mut book = Book::load(vec![(0, vec![entry("pvc-1"), entry("pvc-2")])]);
    assert!(book.forget("pvc-1", Removal::Stale));
    assert!(!book.is_dirty(), "no write just for a stale entry");
    book.record(entry("pvc-3"));
    let commit = book.take_commit(true);
    let written = decode(&commit[0].content).unwrap();
    let volumes: Vec<&str> = written.iter().map(|e| e.volume.as_str()).collect();
    assert_eq!(volumes, ["pvc-2", "pvc-3"]);
}

#[test]
fn a_node_ledger_name_is_a_valid_label_value_and_differs_per_node() {
    let long_lease = "x".repeat(63);
    for lease in ["mock-csi-rs", long_lease.as_str(), "a.b-c_"] {
        let base = node_ledger_base(lease, "node-a");
        assert!(base.len() <= 63, "{base}");
        assert!(
            base.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
                && base.starts_with(|c: char| c.is_ascii_alphanumeric())
                && base.ends_with(|c: char| c.is_ascii_alphanumeric()),
            "{base}"
        );
        assert_eq!(base, node_ledger_base(lease, "node-a"));
        assert_ne!(base, node_ledger_base(lease, "node-b"));
        // Its shards are found again from it.
        assert_eq!(shard_index(&base, &shard_name(&base, 2)), Some(2));
    }
}

#[test]
fn an_entry_that_outgrows_its_full_shard_moves_and_its_new_shard_is_written_first() {
    let mut book = Book::default();
    let per_shard = SHARD_BYTES / entry_bytes(&entry("pvc-00000"));
    for i in 0..per_shard {
        book.record(entry(&format!("pvc-{i:05}")));
    }
    for write in book.take_commit(true) {
        let written = decode(&write.content).unwrap();
        book.committed(&write, &written);
    }
    // A learned volume id makes one entry of the full shard larger than its room.
    book.set_id("pvc-00003", &"x".repeat(128));
    let commit = book.take_commit(true);
    assert_eq!(
        commit.iter().map(|s| s.shard).collect::<Vec<_>>(),
        vec![1, 0],
        "the shard gaining the entry first, then the one losing it"
    );
    assert!(commit.iter().all(|s| s.content.len() <= SHARD_BYTES));
    let moved = decode(&commit[0].content).unwrap();
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].id.as_deref(), Some("x".repeat(128).as_str()));
    assert_eq!(decode(&commit[1].content).unwrap().len(), per_shard - 1);
    assert_eq!(book.len(), per_shard);
}
