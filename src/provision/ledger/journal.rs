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
    #[error("writing intent journal file {file} failed: {source}")]
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

fn shard_of(name: &str) -> Option<usize> {
    name.strip_prefix("intents-")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// Creates `dir` if needed and reads every shard in it.
pub(crate) fn load(dir: &Path) -> Result<Vec<(usize, Vec<Entry>)>, JournalError> {
    let directory = |source| JournalError::Directory {
        dir: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(directory)?;
    let mut shards = Vec::new();
    for item in std::fs::read_dir(dir).map_err(directory)? {
        let item = item.map_err(directory)?;
        let name = item.file_name();
        let Some(index) = name.to_str().and_then(shard_of) else {
            continue;
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
        }
    }

    #[test]
    fn shards_written_are_read_back_and_an_empty_shard_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("journal");
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
        let error = load(&file.join("journal")).unwrap_err().to_string();
        assert!(error.contains("mount a writable hostPath"), "{error}");
    }
}
