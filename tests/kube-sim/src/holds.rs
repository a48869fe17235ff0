//! Crash points: a hold stops the N-th request matching (verb, resource[, name], user agent)
//! either before it is applied or after it is applied and before it is answered, and says so, so a
//! test can kill the client at exactly that point; then the hold is released (a request held
//! before is dropped or applied, one held after is answered). Also the ordered log of write
//! requests, from which a test enumerates the points of a flow.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// When a hold stops its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum When {
    /// Before the request is applied: the store has not changed.
    Before,
    /// After it is applied, before the answer leaves: the store has changed, the client does
    /// not know.
    After,
}

/// One hold rule. Unset matchers match anything; `agent` matches a User-Agent prefix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HoldRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verb: Option<String>,
    /// Plural resource (`persistentvolumes`, `persistentvolumes/status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// User-Agent prefix, e.g. `csi-provisioner`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Which matching request (1 = the first).
    pub nth: u64,
    pub when: When,
}

impl HoldRule {
    fn matches(&self, verb: &str, resource: &str, name: &str, agent: &str) -> bool {
        self.verb.as_deref().is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
            && self.name.as_deref().is_none_or(|n| n == name)
            && self.agent.as_deref().is_none_or(|a| agent.starts_with(a))
    }
}

/// Where a hold stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HoldState {
    /// Waiting for its request.
    Armed,
    /// Its request is stopped.
    Held,
    /// Released: the request went on (`apply`), or was dropped with a 503.
    Released,
}

/// A hold as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoldEntry {
    pub id: u64,
    pub rule: HoldRule,
    /// Matching requests seen so far.
    pub seen: u64,
    pub state: HoldState,
    /// The held request's object name, once held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_name: Option<String>,
}

/// One write request as answered, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteRecord {
    pub seq: u64,
    pub agent: String,
    pub verb: String,
    pub resource: String,
    pub name: String,
}

const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];
/// The write log keeps this many records (oldest dropped first).
const LOG_CAPACITY: usize = 20_000;

struct Hold {
    entry: HoldEntry,
    /// `Some(apply)` once released.
    release: watch::Sender<Option<bool>>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    holds: Vec<Hold>,
    log: VecDeque<WriteRecord>,
    next_seq: u64,
}

/// Handle to the simulator's holds and write log (cheap to clone).
#[derive(Clone, Default)]
pub struct Holds(Arc<Mutex<State>>);

/// A request stopped by a hold; [`Ticket::released`] waits for the release.
pub struct Ticket {
    pub when: When,
    release: watch::Receiver<Option<bool>>,
}

impl Ticket {
    /// Waits until the hold is released; `true`: go on, `false`: drop the request.
    pub async fn released(mut self) -> bool {
        loop {
            if let Some(apply) = *self.release.borrow() {
                return apply;
            }
            if self.release.changed().await.is_err() {
                // The hold was removed: go on as if released.
                return true;
            }
        }
    }
}

impl Holds {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arms a hold; returns its id.
    pub fn add(&self, rule: HoldRule) -> u64 {
        let mut s = self.lock();
        s.next_id += 1;
        let id = s.next_id;
        let (release, _) = watch::channel(None);
        s.holds.push(Hold {
            entry: HoldEntry {
                id,
                rule,
                seen: 0,
                state: HoldState::Armed,
                held_name: None,
            },
            release,
        });
        id
    }

    /// Every hold.
    pub fn list(&self) -> Vec<HoldEntry> {
        self.lock().holds.iter().map(|h| h.entry.clone()).collect()
    }

    /// Releases hold `id`: its request goes on (`apply`) or, if held before being applied, is
    /// dropped with a 503. False when there is no such hold.
    pub fn release(&self, id: u64, apply: bool) -> bool {
        let mut s = self.lock();
        let Some(h) = s.holds.iter_mut().find(|h| h.entry.id == id) else {
            return false;
        };
        h.entry.state = HoldState::Released;
        h.release.send_replace(Some(apply));
        true
    }

    /// Removes every hold, letting held requests go on.
    pub fn clear(&self) {
        let mut s = self.lock();
        for h in &s.holds {
            h.release.send_replace(Some(true));
        }
        s.holds.clear();
    }

    /// Called for every request: the ticket of the hold that stops it, if one does.
    pub(crate) fn arrive(
        &self,
        verb: &str,
        resource: &str,
        name: &str,
        agent: &str,
    ) -> Option<Ticket> {
        let mut s = self.lock();
        for h in &mut s.holds {
            if h.entry.state != HoldState::Armed
                || !h.entry.rule.matches(verb, resource, name, agent)
            {
                continue;
            }
            h.entry.seen += 1;
            if h.entry.seen == h.entry.rule.nth {
                h.entry.state = HoldState::Held;
                h.entry.held_name = Some(name.to_owned());
                tracing::info!(id = h.entry.id, verb, resource, name, when = ?h.entry.rule.when, "request held");
                return Some(Ticket {
                    when: h.entry.rule.when,
                    release: h.release.subscribe(),
                });
            }
        }
        None
    }

    /// Records an answered write request in the log.
    pub(crate) fn log_write(&self, agent: &str, verb: &str, resource: &str, name: &str) {
        if !WRITE_VERBS.contains(&verb) {
            return;
        }
        let mut s = self.lock();
        s.next_seq += 1;
        let seq = s.next_seq;
        if s.log.len() >= LOG_CAPACITY {
            s.log.pop_front();
        }
        s.log.push_back(WriteRecord {
            seq,
            agent: agent.to_owned(),
            verb: verb.to_owned(),
            resource: resource.to_owned(),
            name: name.to_owned(),
        });
    }

    /// The write log, oldest first.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.lock().log.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(nth: u64, when: When) -> HoldRule {
        HoldRule {
            verb: Some("create".into()),
            resource: Some("persistentvolumes".into()),
            name: None,
            agent: Some("csi-provisioner".into()),
            nth,
            when,
        }
    }

    #[tokio::test]
    async fn the_nth_matching_request_is_held_until_released() {
        let holds = Holds::default();
        let id = holds.add(rule(2, When::After));
        assert!(
            holds
                .arrive("create", "persistentvolumes", "a", "kubectl")
                .is_none()
        );
        assert!(
            holds
                .arrive("create", "persistentvolumes", "a", "csi-provisioner/1")
                .is_none()
        );
        let ticket = holds
            .arrive("create", "persistentvolumes", "b", "csi-provisioner/1")
            .expect("the second is held");
        assert_eq!(holds.list()[0].state, HoldState::Held);
        assert_eq!(holds.list()[0].held_name.as_deref(), Some("b"));
        assert!(
            holds
                .arrive("create", "persistentvolumes", "c", "csi-provisioner/1")
                .is_none()
        );
        let waiter = tokio::spawn(ticket.released());
        assert!(holds.release(id, false));
        assert!(!waiter.await.unwrap());
    }

    #[test]
    fn only_writes_are_logged_in_order() {
        let holds = Holds::default();
        holds.log_write("a", "get", "pods", "p");
        holds.log_write("a", "create", "pods", "p");
        holds.log_write("b", "delete", "pods", "p");
        let log = holds.writes();
        assert_eq!(log.len(), 2);
        assert_eq!((log[0].seq, log[1].verb.as_str()), (1, "delete"));
    }
}
