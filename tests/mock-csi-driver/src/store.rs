//! The driver's volumes and snapshots: records, lookups by id and name, per-node pool usage,
//! paging, and the state file (loaded at start, rewritten atomically after every change).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where a volume's initial data came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "id")]
pub enum ContentSource {
    /// Restored from this snapshot id.
    Snapshot(String),
    /// Cloned from this volume id.
    Volume(String),
}

/// One volume as the driver knows it. Secret *keys* the create call carried are kept (so tests
/// can see secrets arrived); secret values never are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// Driver-generated id.
    pub id: String,
    /// CreateVolume name (the idempotency key).
    pub name: String,
    /// Size in bytes.
    pub capacity_bytes: i64,
    /// Node whose pool holds the volume.
    pub node: String,
    /// Topology segment the volume is accessible from (empty without topology).
    #[serde(default)]
    pub segment: BTreeMap<String, String>,
    /// CreateVolume parameters.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Current mutable parameters (CreateVolume, then ControllerModifyVolume).
    #[serde(default)]
    pub mutable_parameters: BTreeMap<String, String>,
    /// Snapshot or volume the data came from.
    #[serde(default)]
    pub content_source: Option<ContentSource>,
    /// Names of the secrets CreateVolume carried, sorted.
    #[serde(default)]
    pub secret_keys: Vec<String>,
    /// volume_context returned to the CO.
    #[serde(default)]
    pub volume_context: BTreeMap<String, String>,
    /// Creation order; also the ListVolumes paging position.
    pub seq: u64,
}

/// One snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// Driver-generated id.
    pub id: String,
    /// CreateSnapshot name (the idempotency key).
    pub name: String,
    /// Volume it was cut from (may since have been deleted).
    pub source_volume_id: String,
    /// Size of the source at the time, in bytes.
    pub size_bytes: i64,
    /// Node the data lives on; restores land there.
    pub node: String,
    /// CreateSnapshot parameters.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Creation time, seconds since the Unix epoch.
    pub creation_time_secs: i64,
    /// Sub-second part of the creation time.
    pub creation_time_nanos: i32,
    /// Creation order; also the ListSnapshots paging position.
    pub seq: u64,
}

/// On-disk form of the state file (the compacted snapshot).
#[derive(Debug, Serialize, Deserialize)]
struct StateFile<V, S> {
    version: u32,
    next_seq: u64,
    volumes: Vec<V>,
    snapshots: Vec<S>,
}

const STATE_FILE_VERSION: u32 = 1;

/// One line of the journal next to the state file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Change {
    PutVolume { volume: VolumeRecord },
    RemoveVolume { id: String },
    PutSnapshot { snapshot: SnapshotRecord },
    RemoveSnapshot { id: String },
}

/// The state file and its journal.
///
/// Every change appends one JSON line to `<state file>.journal` with a single write, which a
/// process death cannot tear. The state file itself is only ever replaced atomically (temporary
/// file + rename): at start-up, and when the journal holds twice as many lines as there are live
/// records. Replaying a journal over a newer state file is harmless, because each line is a
/// whole record or a removal. No fsync: the crashes this driver simulates are process deaths,
/// which the page cache survives.
#[derive(Debug)]
struct Persistence {
    path: PathBuf,
    journal_path: PathBuf,
    journal: Option<std::fs::File>,
    lines: usize,
    needs_compaction: bool,
}

/// Why the state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot read state file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "state file {path} is not valid mock-csi-driver state (delete it to start empty): {source}"
    )]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "state file {path} has version {found}, this driver reads version {STATE_FILE_VERSION}; delete it to start empty"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("cannot write state file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One page of a listing.
#[derive(Debug)]
pub struct Page<'a, T> {
    /// The entries, in creation order.
    pub entries: Vec<&'a T>,
    /// Token for the next page, when entries remain.
    pub next_token: Option<String>,
}

/// All volumes and snapshots, indexed for the lookups the RPCs make.
#[derive(Debug, Default)]
pub struct Store {
    volumes: BTreeMap<u64, VolumeRecord>,
    volume_ids: HashMap<String, u64>,
    volume_names: HashMap<String, u64>,
    snapshots: BTreeMap<u64, SnapshotRecord>,
    snapshot_ids: HashMap<String, u64>,
    snapshot_names: HashMap<String, u64>,
    used: HashMap<String, i64>,
    next_seq: u64,
    pending: Vec<Change>,
    persistence: Option<Persistence>,
}

impl Store {
    /// Opens the state file `path` (and its journal): loads what an earlier run left, compacts it
    /// into the state file, and persists every later change (see [`Store::persist`]).
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let mut store = Store::default();
        let mut next_seq = 0;
        if let Some(text) = read_if_exists(path)? {
            let file: StateFile<VolumeRecord, SnapshotRecord> = serde_json::from_str(&text)
                .map_err(|source| StoreError::Parse {
                    path: path.to_owned(),
                    source,
                })?;
            if file.version != STATE_FILE_VERSION {
                return Err(StoreError::Version {
                    path: path.to_owned(),
                    found: file.version,
                });
            }
            next_seq = file.next_seq;
            file.volumes.into_iter().for_each(|v| store.put_volume(v));
            file.snapshots
                .into_iter()
                .for_each(|s| store.put_snapshot(s));
        }
        let journal_path = journal_path(path);
        if let Some(text) = read_if_exists(&journal_path)? {
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            for (i, line) in lines.iter().enumerate() {
                let change = match serde_json::from_str::<Change>(line) {
                    Ok(c) => c,
                    // Only the last line can be incomplete (a write cut short by a full disk).
                    Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {
                        tracing::warn!(journal = %journal_path.display(), "ignoring an incomplete last journal line");
                        break;
                    }
                    Err(source) => {
                        return Err(StoreError::Parse {
                            path: journal_path.clone(),
                            source,
                        });
                    }
                };
                match change {
                    Change::PutVolume { volume } => {
                        next_seq = next_seq.max(volume.seq + 1);
                        store.put_volume(volume);
                    }
                    Change::RemoveVolume { id } => drop(store.remove_volume(&id)),
                    Change::PutSnapshot { snapshot } => {
                        next_seq = next_seq.max(snapshot.seq + 1);
                        store.put_snapshot(snapshot);
                    }
                    Change::RemoveSnapshot { id } => drop(store.remove_snapshot(&id)),
                }
            }
        }
        // Never hand out a sequence number twice, even if the file was edited by hand.
        let highest = store
            .volumes
            .keys()
            .chain(store.snapshots.keys())
            .max()
            .map_or(0, |s| s + 1);
        store.next_seq = next_seq.max(highest);
        store.persistence = Some(Persistence {
            path: path.to_owned(),
            journal_path,
            journal: None,
            lines: 0,
            needs_compaction: true,
        });
        store.persist()?;
        Ok(store)
    }

    /// Writes the changes made since the last call (nothing without a state file). After a
    /// failed write the next call rewrites the whole state, so the caller may undo its change
    /// in memory and carry on.
    pub fn persist(&mut self) -> Result<(), StoreError> {
        let pending = std::mem::take(&mut self.pending);
        let live = self.volumes.len() + self.snapshots.len();
        let Some(p) = self.persistence.as_mut() else {
            return Ok(());
        };
        if p.needs_compaction || p.lines + pending.len() > 2 * live + 1024 {
            return self.compact();
        }
        let mut buf = Vec::new();
        for change in &pending {
            serde_json::to_writer(&mut buf, change).map_err(|e| StoreError::Write {
                path: p.journal_path.clone(),
                source: std::io::Error::other(e),
            })?;
            buf.push(b'\n');
        }
        let written = match p.journal.as_mut() {
            Some(f) => f.write_all(&buf),
            None => Err(std::io::Error::other("journal is not open")),
        };
        match written {
            Ok(()) => {
                p.lines += pending.len();
                Ok(())
            }
            Err(source) => {
                p.needs_compaction = true;
                Err(StoreError::Write {
                    path: p.journal_path.clone(),
                    source,
                })
            }
        }
    }

    /// Replaces the state file atomically with the whole state, then starts an empty journal.
    fn compact(&mut self) -> Result<(), StoreError> {
        let file = StateFile {
            version: STATE_FILE_VERSION,
            next_seq: self.next_seq,
            volumes: self.volumes.values().collect(),
            snapshots: self.snapshots.values().collect(),
        };
        let Some(p) = self.persistence.as_mut() else {
            return Ok(());
        };
        p.needs_compaction = true;
        let err = |path: &Path| {
            let path = path.to_owned();
            move |source| StoreError::Write { path, source }
        };
        let bytes =
            serde_json::to_vec(&file).map_err(|e| err(&p.path)(std::io::Error::other(e)))?;
        let mut tmp_name = p.path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp = p.path.with_file_name(tmp_name);
        std::fs::write(&tmp, &bytes).map_err(err(&tmp))?;
        std::fs::rename(&tmp, &p.path).map_err(err(&p.path))?;
        // The state file now holds everything the journal said; start the journal afresh.
        let journal = std::fs::File::create(&p.journal_path).map_err(err(&p.journal_path))?;
        p.journal = Some(journal);
        p.lines = 0;
        p.needs_compaction = false;
        Ok(())
    }

    fn log(&mut self, change: impl FnOnce() -> Change) {
        if self.persistence.is_some() {
            self.pending.push(change());
        }
    }

    /// Hands out the next creation sequence number.
    pub fn next_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Adds (or replaces) a volume; its `seq` must come from [`Store::next_seq`].
    pub fn put_volume(&mut self, v: VolumeRecord) {
        if let Some(old) = self.remove_volume(&v.id) {
            tracing::debug!(volume_id = %old.id, "replacing volume record");
        }
        self.log(|| Change::PutVolume { volume: v.clone() });
        *self.used.entry(v.node.clone()).or_default() += v.capacity_bytes;
        self.volume_ids.insert(v.id.clone(), v.seq);
        self.volume_names.insert(v.name.clone(), v.seq);
        self.volumes.insert(v.seq, v);
    }

    /// Removes a volume by id.
    pub fn remove_volume(&mut self, id: &str) -> Option<VolumeRecord> {
        let seq = self.volume_ids.remove(id)?;
        let v = self.volumes.remove(&seq)?;
        self.log(|| Change::RemoveVolume { id: id.to_owned() });
        if self.volume_names.get(&v.name) == Some(&seq) {
            self.volume_names.remove(&v.name);
        }
        if let Some(used) = self.used.get_mut(&v.node) {
            *used -= v.capacity_bytes;
        }
        Some(v)
    }

    /// A volume by id.
    pub fn volume(&self, id: &str) -> Option<&VolumeRecord> {
        self.volume_ids
            .get(id)
            .and_then(|seq| self.volumes.get(seq))
    }

    /// A volume by CreateVolume name.
    pub fn volume_by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.volume_names
            .get(name)
            .and_then(|seq| self.volumes.get(seq))
    }

    /// Changes a volume in place, keeping pool usage right.
    pub fn update_volume(&mut self, id: &str, f: impl FnOnce(&mut VolumeRecord)) -> bool {
        let Some(mut v) = self.remove_volume(id) else {
            return false;
        };
        f(&mut v);
        self.put_volume(v);
        true
    }

    /// Bytes used on `node`.
    pub fn used_on(&self, node: &str) -> i64 {
        self.used.get(node).copied().unwrap_or(0)
    }

    /// Number of volumes.
    pub fn volume_count(&self) -> usize {
        self.volumes.len()
    }

    /// Every volume, in creation order.
    pub fn volumes(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.volumes.values()
    }

    /// Every snapshot, in creation order.
    pub fn snapshots(&self) -> impl Iterator<Item = &SnapshotRecord> {
        self.snapshots.values()
    }

    /// Adds (or replaces) a snapshot.
    pub fn put_snapshot(&mut self, s: SnapshotRecord) {
        self.remove_snapshot(&s.id);
        self.log(|| Change::PutSnapshot {
            snapshot: s.clone(),
        });
        self.snapshot_ids.insert(s.id.clone(), s.seq);
        self.snapshot_names.insert(s.name.clone(), s.seq);
        self.snapshots.insert(s.seq, s);
    }

    /// Removes a snapshot by id.
    pub fn remove_snapshot(&mut self, id: &str) -> Option<SnapshotRecord> {
        let seq = self.snapshot_ids.remove(id)?;
        let s = self.snapshots.remove(&seq)?;
        self.log(|| Change::RemoveSnapshot { id: id.to_owned() });
        if self.snapshot_names.get(&s.name) == Some(&seq) {
            self.snapshot_names.remove(&s.name);
        }
        Some(s)
    }

    /// A snapshot by id.
    pub fn snapshot(&self, id: &str) -> Option<&SnapshotRecord> {
        self.snapshot_ids
            .get(id)
            .and_then(|seq| self.snapshots.get(seq))
    }

    /// A snapshot by CreateSnapshot name.
    pub fn snapshot_by_name(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshot_names
            .get(name)
            .and_then(|seq| self.snapshots.get(seq))
    }

    /// Reads a paging token: the sequence number to resume at, which this store handed out.
    /// `None` means the token is not one of ours (the caller answers ABORTED).
    pub fn parse_token(&self, token: &str) -> Option<u64> {
        if token.is_empty() {
            return Some(0);
        }
        token
            .parse::<u64>()
            .ok()
            .filter(|seq| *seq <= self.next_seq)
    }

    /// A page of volumes starting at sequence `start`; `max == 0` means all.
    pub fn page_volumes(&self, start: u64, max: usize) -> Page<'_, VolumeRecord> {
        page(self.volumes.range(start..), max)
    }

    /// A page of snapshots starting at `start` that pass `keep`; `max == 0` means all.
    pub fn page_snapshots(
        &self,
        start: u64,
        max: usize,
        keep: impl Fn(&SnapshotRecord) -> bool,
    ) -> Page<'_, SnapshotRecord> {
        page(self.snapshots.range(start..).filter(|(_, s)| keep(s)), max)
    }
}

fn read_if_exists(path: &Path) -> Result<Option<String>, StoreError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StoreError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// `<state file>.journal`.
pub fn journal_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".journal");
    path.with_file_name(name)
}

fn page<'a, T: 'a>(mut items: impl Iterator<Item = (&'a u64, &'a T)>, max: usize) -> Page<'a, T> {
    let limit = if max == 0 { usize::MAX } else { max };
    let entries: Vec<&T> = items.by_ref().take(limit).map(|(_, t)| t).collect();
    // The token is the position of the first entry not returned, so entries deleted between
    // pages never make the walk skip or repeat the others.
    let next_token = items.next().map(|(seq, _)| seq.to_string());
    Page {
        entries,
        next_token,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(store: &mut Store, name: &str, node: &str, size: i64) -> String {
        let seq = store.next_seq();
        let id = format!("vol-{seq}");
        store.put_volume(VolumeRecord {
            id: id.clone(),
            name: name.to_owned(),
            capacity_bytes: size,
            node: node.to_owned(),
            segment: BTreeMap::new(),
            parameters: BTreeMap::new(),
            mutable_parameters: BTreeMap::new(),
            content_source: None,
            secret_keys: vec![],
            volume_context: BTreeMap::new(),
            seq,
        });
        id
    }

    #[test]
    fn pool_usage_follows_creates_updates_and_deletes() {
        let mut s = Store::default();
        let a = vol(&mut s, "a", "n1", 10);
        vol(&mut s, "b", "n1", 5);
        vol(&mut s, "c", "n2", 7);
        assert_eq!((s.used_on("n1"), s.used_on("n2")), (15, 7));
        s.update_volume(&a, |v| v.capacity_bytes = 20);
        assert_eq!(s.used_on("n1"), 25);
        s.remove_volume(&a);
        assert_eq!(s.used_on("n1"), 5);
        assert!(s.volume_by_name("a").is_none());
    }

    #[test]
    fn paging_visits_every_volume_once_even_when_one_is_deleted_mid_walk() {
        let mut s = Store::default();
        let ids: Vec<String> = (0..7)
            .map(|i| vol(&mut s, &format!("v{i}"), "n", 1))
            .collect();
        let mut seen = vec![];
        let mut token = String::new();
        loop {
            let start = s.parse_token(&token).unwrap();
            let (page_ids, next) = {
                let page = s.page_volumes(start, 3);
                assert!(page.entries.len() <= 3);
                let ids: Vec<String> = page.entries.iter().map(|v| v.id.clone()).collect();
                (ids, page.next_token)
            };
            seen.extend(page_ids);
            if seen.len() == 3 {
                // Deleting an already-seen volume must not shift the rest of the walk.
                s.remove_volume(&ids[0]);
            }
            match next {
                Some(t) => token = t,
                None => break,
            }
        }
        assert_eq!(seen, ids);
    }

    #[test]
    fn tokens_not_handed_out_by_the_store_are_rejected() {
        let mut s = Store::default();
        vol(&mut s, "a", "n", 1);
        assert_eq!(s.parse_token(""), Some(0));
        assert_eq!(s.parse_token("1"), Some(1));
        assert_eq!(s.parse_token("invalid-token"), None);
        assert_eq!(s.parse_token("99"), None);
        assert_eq!(s.parse_token("-1"), None);
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn every_persisted_change_survives_a_process_death_and_sequence_numbers_stay_unique() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut s = Store::open(&path).unwrap();
        let a = vol(&mut s, "a", "n1", 10);
        let b = vol(&mut s, "b", "n2", 20);
        s.persist().unwrap();
        s.remove_volume(&b);
        s.update_volume(&a, |v| v.capacity_bytes = 15);
        s.persist().unwrap();
        // Dropped without any shutdown work, as a killed process would.
        drop(s);
        let mut loaded = Store::open(&path).unwrap();
        assert_eq!(loaded.volume_count(), 1);
        assert_eq!(loaded.volume_by_name("a").unwrap().capacity_bytes, 15);
        assert_eq!(loaded.used_on("n1"), 15);
        assert_eq!(
            loaded.next_seq(),
            2,
            "the deleted volume's sequence number is not reused"
        );
        assert_eq!(files(dir.path()), vec!["state.json", "state.json.journal"]);
        // Opening compacted everything into the state file.
        assert_eq!(std::fs::read_to_string(journal_path(&path)).unwrap(), "");
    }

    #[test]
    fn an_incomplete_last_journal_line_is_ignored_but_a_corrupt_middle_line_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut s = Store::open(&path).unwrap();
        vol(&mut s, "a", "n1", 10);
        s.persist().unwrap();
        drop(s);
        let journal = journal_path(&path);
        let good = std::fs::read_to_string(&journal).unwrap();
        std::fs::write(&journal, format!("{good}{{\"op\":\"put_vol")).unwrap();
        assert_eq!(Store::open(&path).unwrap().volume_count(), 1);

        std::fs::write(&journal, format!("{{broken\n{good}")).unwrap();
        let err = Store::open(&path).unwrap_err().to_string();
        assert!(
            err.contains("state.json.journal") && err.contains("delete it"),
            "{err}"
        );
    }

    #[test]
    fn the_journal_is_compacted_when_it_outgrows_the_live_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut s = Store::open(&path).unwrap();
        for i in 0..3000 {
            let id = vol(&mut s, &format!("v{i}"), "n", 1);
            s.remove_volume(&id);
            s.persist().unwrap();
        }
        let lines = std::fs::read_to_string(journal_path(&path))
            .unwrap()
            .lines()
            .count();
        assert!(lines <= 1024 + 2, "journal has {lines} lines");
        drop(s);
        let mut loaded = Store::open(&path).unwrap();
        assert_eq!(loaded.volume_count(), 0);
        assert_eq!(loaded.next_seq(), 3000);
    }

    #[test]
    fn a_corrupt_state_file_is_an_error_and_no_file_means_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            Store::open(&dir.path().join("none.json"))
                .unwrap()
                .volume_count(),
            0
        );
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{not json").unwrap();
        let err = Store::open(&bad).unwrap_err().to_string();
        assert!(err.contains("delete it to start empty"), "{err}");
    }
}
