//! Crash points in the driver: a hold stops the N-th call of a CSI method before it runs (no
//! effect) or after it ran and before it is answered (the effect persisted, the caller does not
//! know), and says so in the state dump, so a test can kill the caller at exactly that point and
//! then release the call. Generalises the crash-after-create switch to every method and both
//! sides of the effect. Also the ordered log of calls, from which a test enumerates the points.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// When a hold stops its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HoldWhen {
    /// Before the operation runs.
    Before,
    /// After it ran (and persisted), before the answer.
    After,
}

/// Where a hold stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HoldState {
    /// Waiting for its call.
    Armed,
    /// Its call is stopped.
    Held,
    /// Released.
    Released,
}

/// A hold as the state dump shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldDump {
    /// The N-th call of the method is held.
    pub nth: u64,
    /// Before or after the effect.
    pub when: HoldWhen,
    /// Calls of the method seen since the hold was set.
    pub seen: u64,
    /// Armed, held or released.
    pub state: HoldState,
}

const LOG_CAPACITY: usize = 20_000;

struct Hold {
    dump: HoldDump,
    release: watch::Sender<Option<bool>>,
}

#[derive(Default)]
struct State {
    holds: BTreeMap<String, Hold>,
    log: VecDeque<String>,
}

/// The holds and the call log; shared by the RPCs and the control socket.
#[derive(Default)]
pub struct Holds {
    state: Mutex<State>,
}

impl std::fmt::Debug for Holds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holds").finish_non_exhaustive()
    }
}

/// A call stopped by a hold.
pub struct HoldTicket {
    /// Before or after the effect.
    pub when: HoldWhen,
    release: watch::Receiver<Option<bool>>,
}

impl HoldTicket {
    /// Waits for the release: `true` to go on, `false` to drop a call held before its effect.
    pub async fn released(mut self) -> bool {
        loop {
            if let Some(apply) = *self.release.borrow() {
                return apply;
            }
            if self.release.changed().await.is_err() {
                return true;
            }
        }
    }
}

impl Holds {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds the `nth` next call of `method` (replacing a hold of that method).
    pub fn set(&self, method: &str, nth: u64, when: HoldWhen) {
        let (release, _) = watch::channel(None);
        self.lock().holds.insert(
            method.to_owned(),
            Hold {
                dump: HoldDump {
                    nth,
                    when,
                    seen: 0,
                    state: HoldState::Armed,
                },
                release,
            },
        );
    }

    /// Releases the hold of `method`; false without one.
    pub fn release(&self, method: &str, apply: bool) -> bool {
        let mut st = self.lock();
        let Some(h) = st.holds.get_mut(method) else {
            return false;
        };
        h.dump.state = HoldState::Released;
        h.release.send_replace(Some(apply));
        true
    }

    /// Called for every call: logs it and returns the ticket of the hold that stops it.
    pub fn arrive(&self, method: &str) -> Option<HoldTicket> {
        let mut st = self.lock();
        if st.log.len() >= LOG_CAPACITY {
            st.log.pop_front();
        }
        st.log.push_back(method.to_owned());
        let h = st.holds.get_mut(method)?;
        if h.dump.state != HoldState::Armed {
            return None;
        }
        h.dump.seen += 1;
        if h.dump.seen != h.dump.nth {
            return None;
        }
        h.dump.state = HoldState::Held;
        tracing::warn!(method, when = ?h.dump.when, "call held");
        Some(HoldTicket {
            when: h.dump.when,
            release: h.release.subscribe(),
        })
    }

    /// The holds by method.
    pub fn dump(&self) -> BTreeMap<String, HoldDump> {
        self.lock()
            .holds
            .iter()
            .map(|(m, h)| (m.clone(), h.dump.clone()))
            .collect()
    }

    /// Every call's method, in order.
    pub fn log(&self) -> Vec<String> {
        self.lock().log.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_nth_call_is_held_and_released() {
        let holds = Holds::default();
        holds.set("DeleteVolume", 2, HoldWhen::Before);
        assert!(holds.arrive("DeleteVolume").is_none());
        assert!(holds.arrive("CreateVolume").is_none());
        let ticket = holds
            .arrive("DeleteVolume")
            .expect("the second DeleteVolume");
        assert_eq!(holds.dump()["DeleteVolume"].state, HoldState::Held);
        let waiter = tokio::spawn(ticket.released());
        assert!(holds.release("DeleteVolume", false));
        assert!(!waiter.await.unwrap());
        assert_eq!(
            holds.log(),
            ["DeleteVolume", "CreateVolume", "DeleteVolume"]
        );
    }
}
