//! The ledger's shell over the node-local journal (`--node-deployment-intent-journal`): opening it
//! and one commit into its files, in place of the Lease writes of [`super`].

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tracing::{info, warn};

use super::super::journal::{self, JournalError};
use super::super::{Book, Entry, decode};
use super::{Inner, Ledger, LedgerError, State};
use crate::sync::lock;

impl Ledger {
    /// The ledger kept in the files of `dir` ([`journal`]): no API request to record an intent.
    /// Waits while another process holds the journal (a pod still stopping). An unreadable
    /// journal is an error (never overwritten).
    pub(crate) async fn open_journal(
        dir: &Path,
        count: Arc<AtomicI64>,
    ) -> Result<Self, JournalError> {
        journal::prepare(dir)?;
        let mut told = false;
        let held = loop {
            if let Some(held) = journal::try_lock(dir)? {
                break held;
            }
            if !std::mem::replace(&mut told, true) {
                warn!(journal = %dir.display(), "another process holds the intent journal's lock (.lock; an earlier pod of this node still stopping?): waiting for it");
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        };
        let book = Book::load(journal::load(dir)?);
        info!(journal = %dir.display(), intents = book.len(), "intent journal loaded");
        count.store(book.len() as i64, Ordering::Relaxed);
        Ok(Self(Arc::new(Inner {
            state: Mutex::new(State {
                book,
                ..State::default()
            }),
            wake: Notify::new(),
            enabled: true,
            flush: AtomicBool::new(false),
            recording: AtomicBool::new(false),
            target: None,
            journal: Some((dir.to_owned(), held)),
            count,
        })))
    }

    /// Takes in entries recorded elsewhere (a node's Lease ledger when it moves to a journal),
    /// written with the next commit.
    pub(crate) fn take_in(&self, entries: Vec<Entry>) {
        let mut state = lock(&self.0.state);
        for entry in entries {
            state.book.record(entry);
        }
        self.publish(&state.book);
    }

    /// Writes what is pending now (outside the committer); whether it succeeded.
    pub(crate) async fn flush(&self) -> bool {
        self.commit_once(true).await
    }

    /// [`Self::commit_once`] into the journal's files (blocking file I/O off the runtime).
    pub(super) async fn commit_journal(&self, dir: &Path, removals: bool) -> bool {
        let (commit, waiters) = {
            let mut state = lock(&self.0.state);
            let commit = state.book.take_commit(removals);
            (commit, std::mem::take(&mut state.waiters))
        };
        let (dir, writes) = (dir.to_owned(), commit.shards.clone());
        let results = tokio::task::spawn_blocking(move || {
            let write = |w: &super::super::ShardWrite| journal::write(&dir, w.shard, &w.content);
            writes.iter().map(write).collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let mut failure = (results.len() != commit.shards.len())
            .then(|| LedgerError::Journal("the intent journal writer panicked".to_owned()));
        let mut state = lock(&self.0.state);
        for (write, result) in commit.shards.iter().zip(results) {
            match result {
                Ok(()) => state
                    .book
                    .committed(write, &decode(&write.content).unwrap_or_default()),
                Err(e) => {
                    warn!("{e}; retrying");
                    failure = Some(LedgerError::Journal(e.to_string()));
                }
            }
        }
        if failure.is_some() {
            for write in &commit.shards {
                state.book.failed(write.shard);
            }
        }
        drop(state);
        for waiter in waiters {
            let _ = waiter.send(failure.clone().map_or(Ok(()), Err));
        }
        failure.is_none()
    }
}
