//! Node mode, opt-in (`--node-deployment-intent-journal`): the intent ledger kept in files on the
//! node instead of Leases, so recording an intent costs no API request at all.
//!
//! Why it is safe there: a node's intents matter only to that node's instance. A node gone for
//! good takes its volumes with it (the dead-node clean-up never calls DeleteVolume for them), and
//! a node that comes back finds its files again (a hostPath survives the pod), so a claim deleted
//! or moved meanwhile still gets its volume deleted. What the files cannot do is be read by other
//! instances: a claim whose node lost our driver is rescheduled at once instead of waiting for
//! the node; a copy made elsewhere meanwhile is deleted by this node's resolver when it is back.
//!
//! One file per shard (`intents-<n>.json`, the same JSON list as a Lease's annotation), replaced
//! atomically: written to a temporary file, synced, renamed over, and the directory synced, so a
//! crash leaves the old content or the new, never a mix. A shard with no entries is removed.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{Entry, decode};

/// Why the journal cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    /// The directory cannot be created or read.
    #[error(
        "intent journal directory {dir}: {source}; mount a writable hostPath there (the CSI socket's directory works) or remove --node-deployment-intent-journal"
    )]
    Directory {
        /// The directory.
        dir: String,
        /// What the filesystem said.
        source: std::io::Error,
    },
    /// A shard file cannot be read or decoded: never overwritten, it may list in-flight volumes.
    #[error(
        "intent journal file {file} cannot be read: {message}; repair or remove it (it lists volumes whose CreateVolume may have been sent)"
    )]
    Unreadable {
        /// The file.
        file: String,
        /// What was wrong.
        message: String,
    },
    /// A write failed.
    #[error(
        "writing intent journal file {file} failed: {source}; free space or make its directory writable, or remove --node-deployment-intent-journal"
    )]
    Write {
        /// The file.
        file: String,
        /// What the filesystem said.
        source: std::io::Error,
    },
}

/// The file of shard `index` in `dir`.
pub(crate) fn shard_file(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("intents-{index}.json"))
}

/// More shards than a node ever fills (each holds 192 KiB of entries): a larger index is not ours.
const MAX_SHARDS: usize = 1024;

/// The shard index of a file name, only in the form [`shard_file`] writes (`intents-01.json` would
/// never be rewritten or removed, and would bring its entries back at every start).
fn shard_of(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("intents-")?.strip_suffix(".json")?;
    let index: usize = digits.parse().ok()?;
    (index < MAX_SHARDS && index.to_string() == digits).then_some(index)
}

fn directory_error(dir: &Path) -> impl Fn(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Directory {
        dir: dir.display().to_string(),
        source,
    }
}

/// Creates `dir` if it is missing (its parent must exist: a missing mount is an error, not a
/// directory made in the container's own filesystem), and warns when it is on the container's
/// root filesystem, which a restarted container does not keep.
pub(crate) fn prepare(dir: &Path) -> Result<(), JournalError> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::create_dir(dir) {
        Ok(()) => {
            // The new directory entry is durable only once its parent is synced.
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::File::open(parent)
                    .and_then(|p| p.sync_all())
                    .map_err(directory_error(dir))?;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(directory_error(dir)(e)),
    }
    let device = std::fs::metadata(dir).map_err(directory_error(dir))?.dev();
    if std::fs::metadata("/").is_ok_and(|root| root.dev() == device) {
        tracing::warn!(
            journal = %dir.display(),
            "the intent journal is on the root filesystem: in a container that is the container's own and is lost when it restarts, with the intents in it; mount a hostPath there (the CSI socket's directory works)"
        );
    }
    Ok(())
}

/// Takes the journal's lock (`<dir>/.lock`, held while the returned file is open), or `None` when
/// another process holds it: two writers would overwrite each other's intents.
pub(crate) fn try_lock(dir: &Path) -> Result<Option<std::fs::File>, JournalError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(dir.join(".lock"))
        .map_err(directory_error(dir))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(directory_error(dir)(e)),
    }
}

/// Reads every shard in `dir` ([`prepare`]d).
pub(crate) fn load(dir: &Path) -> Result<Vec<(usize, Vec<Entry>)>, JournalError> {
    let directory = directory_error(dir);
    let mut shards = Vec::new();
    for item in std::fs::read_dir(dir).map_err(&directory)? {
        let item = item.map_err(&directory)?;
        let name = item.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with("intents-")) else {
            continue;
        };
        let Some(index) = shard_of(name) else {
            return Err(JournalError::Unreadable {
                file: item.path().display().to_string(),
                message: "not a shard name this sidecar writes".to_owned(),
            });
        };
        let path = item.path();
        let unreadable = |message: String| JournalError::Unreadable {
            file: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| unreadable(e.to_string()))?;
        shards.push((index, decode(&text).map_err(unreadable)?));
    }
    shards.sort_by_key(|(index, _)| *index);
    Ok(shards)
}

/// Replaces shard `index` of `dir` with `content` (a JSON list of entries) atomically; an empty
/// list removes the file.
pub(crate) fn write(dir: &Path, index: usize, content: &str) -> Result<(), JournalError> {
    let file = shard_file(dir, index);
    let failed = |source| JournalError::Write {
        file: file.display().to_string(),
        source,
    };
    if decode(content).is_ok_and(|entries| entries.is_empty()) {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(failed(e)),
        }
    } else {
        let temporary = dir.join(format!(".intents-{index}.json.tmp"));
        let mut out = std::fs::File::create(&temporary).map_err(failed)?;
        out.write_all(content.as_bytes()).map_err(failed)?;
        out.sync_all().map_err(failed)?;
        drop(out);
        std::fs::rename(&temporary, &file).map_err(failed)?;
    }
    // The rename (or removal) itself is durable only once the directory is synced.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::ledger::encode;

    fn entry(volume: &str) -> Entry {
        Entry {
            volume: volume.to_owned(),
            namespace: "ns".to_owned(),
            claim: "data".to_owned(),
            uid: "uid-1".to_owned(),
            secret: None,
            id: None,
            request: k8s_openapi::ByteString(vec![1, 2, 3]),
            retain: false,
            approximate: false,
        }
    }

    #[test]
    fn shards_written_are_read_back_and_an_empty_shard_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("journal");
        prepare(&journal).unwrap();
        assert!(load(&journal).unwrap().is_empty(), "created empty");
        let (a, b) = (entry("pvc-a"), entry("pvc-b"));
        write(&journal, 0, &encode(&[&a, &b])).unwrap();
        write(&journal, 2, &encode(&[&b])).unwrap();
        assert_eq!(
            load(&journal).unwrap(),
            vec![(0, vec![a.clone(), b.clone()]), (2, vec![b.clone()])]
        );

        write(&journal, 2, &encode(&[])).unwrap();
        write(&journal, 3, &encode(&[])).unwrap();
        assert_eq!(load(&journal).unwrap(), vec![(0, vec![a, b])]);
        let names: Vec<_> = std::fs::read_dir(&journal)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| !name.starts_with(".lock"))
            .collect();
        assert_eq!(names, ["intents-0.json"], "no temporary file left either");
    }

    #[test]
    fn an_unreadable_shard_is_an_error_naming_the_file_not_an_empty_journal() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(shard_file(dir.path(), 1), "{not json").unwrap();
        let error = load(dir.path()).unwrap_err().to_string();
        assert!(error.contains("intents-1.json"), "{error}");
        assert!(error.contains("repair or remove it"), "{error}");
    }

    #[test]
    fn a_directory_that_cannot_be_made_says_what_to_mount() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let error = prepare(&file.join("journal")).unwrap_err().to_string();
        assert!(error.contains("mount a writable hostPath"), "{error}");
        let missing_mount = dir.path().join("not-mounted").join("journal");
        assert!(prepare(&missing_mount).is_err(), "the parent is never made");
    }

    #[test]
    fn only_shard_names_this_sidecar_writes_are_read_and_others_are_an_error() {
        assert_eq!(shard_of("intents-0.json"), Some(0));
        assert_eq!(shard_of("intents-12.json"), Some(12));
        for name in [
            "intents-01.json",
            "intents-+1.json",
            "intents-99999999999.json",
        ] {
            assert_eq!(shard_of(name), None, "{name}");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("intents-01.json"), "[]").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let error = load(dir.path()).unwrap_err().to_string();
        assert!(error.contains("intents-01.json"), "{error}");
    }

    #[test]
    fn a_second_process_cannot_take_the_journal_while_the_first_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let held = try_lock(dir.path()).unwrap().expect("free at first");
        // Another open file description: as another process would have.
        assert!(try_lock(dir.path()).unwrap().is_none());
        drop(held);
        assert!(
            try_lock(dir.path()).unwrap().is_some(),
            "free once released"
        );
    }
}
