//! The dead-node clean-up's settings and timing: the grace rule ([`grace_deadline`]), how often to
//! look, which instances act on a volume (rendezvous ranks) and how long fallbacks wait.

use std::time::{Duration, Instant};

use crate::model::locate::{Mode, PerNodeKeys};
use crate::rendezvous;

/// Only this many instances (the first in rendezvous order) track a volume: one actor and two
/// fallbacks. The rest hold no state for it, so memory does not grow with the number of nodes.
pub(crate) const MAX_ACTOR_RANKS: usize = 3;
/// Longest extra wait per rank before a fallback instance acts (see [`fallback_delay`]).
pub(crate) const MAX_FALLBACK_DELAY: Duration = Duration::from_secs(120);
/// How soon to look again after a lookup that neither confirmed nor refuted absence (at most; see
/// [`check_interval`]).
pub(crate) const UNKNOWN_RECHECK: Duration = Duration::from_secs(30);

/// How often the shell looks at the candidates, and how soon it asks again after an "unknown"
/// answer: a tenth of the grace period, between 1 s and [`UNKNOWN_RECHECK`] (30 s for the default
/// 5m grace period). Shorter grace periods (tests, impatient admins) get proportionally prompt checks
/// without a busy loop.
pub(crate) fn check_interval(grace_period: Duration) -> Duration {
    (grace_period / 10).clamp(Duration::from_secs(1), UNKNOWN_RECHECK)
}

/// When an absence first seen at `first_absent` may be acted on by the instance of rendezvous
/// `rank`: after the grace period, plus `fallback_delay` per rank. The one grace rule for a missing
/// node, for its volumes here and for provisioning intents left on it
/// (`provision::controller::node_gone`, where the actor is chosen per claim: rank 0).
pub(crate) fn grace_deadline(
    first_absent: Instant,
    grace_period: Duration,
    fallback_delay: Duration,
    rank: usize,
) -> Instant {
    let extra = fallback_delay.saturating_mul(u32::try_from(rank).unwrap_or(u32::MAX));
    first_absent + grace_period.saturating_add(extra)
}

/// Extra wait per rendezvous rank before a fallback instance acts: half the grace period, between
/// 1 s and [`MAX_FALLBACK_DELAY`] (2 minutes for the default 5m grace period). An admin who shortens
/// the grace period wants a prompt answer even when the first instance is stuck; the fallback
/// re-reads the PV before acting, so a late first instance and its fallback do not both act.
pub(crate) fn fallback_delay(grace_period: Duration) -> Duration {
    (grace_period / 2).clamp(Duration::from_secs(1), MAX_FALLBACK_DELAY)
}

/// Rendezvous key of the dead-node clean-up for one driver. In node mode each instance watches only
/// its own node's PVs, so nobody sees a dead node's PVs except the instance that lists them; the
/// clean-up therefore is one job per driver (discover, then act), handed to the first live instance
/// in rendezvous order for this key, with the next ones as fallbacks.
pub(crate) fn janitor_key(driver: &str) -> String {
    format!("{driver}/deleted-node-cleanup")
}

/// This instance's rank for `key` among `live` instances (the nodes whose CSINode lists our
/// driver). Controller mode has a single active instance: always rank 0. `None`: do not track.
pub(crate) fn actor_rank<'a, I>(mode: Mode, key: &str, me: &str, live: I) -> Option<usize>
where
    I: IntoIterator<Item = &'a str>,
{
    match mode {
        Mode::Controller => Some(0),
        Mode::Node => rendezvous::rank_of(key, me, live).filter(|r| *r < MAX_ACTOR_RANKS),
    }
}

/// Settings of the dead-node clean-up.
#[derive(Clone, Debug)]
pub(crate) struct GoneConfig {
    /// Our driver's name.
    pub(crate) driver: String,
    /// Deployment mode.
    pub(crate) mode: Mode,
    /// `--deleted-node-grace-period`.
    pub(crate) grace_period: Duration,
    /// Extra wait per rendezvous rank ([`fallback_delay`]).
    pub(crate) fallback_delay: Duration,
    /// `--deleted-node-pvc-cleanup`.
    pub(crate) pvc_cleanup: bool,
    /// Keys whose value identifies one node.
    pub(crate) per_node_keys: PerNodeKeys,
    /// How soon to ask again after an answer that is neither presence nor absence.
    pub(crate) unknown_recheck: Duration,
}

impl GoneConfig {
    /// Defaults for everything but the flags.
    pub(crate) fn new(driver: &str, mode: Mode, grace_period: Duration, pvc_cleanup: bool) -> Self {
        Self {
            driver: driver.to_owned(),
            mode,
            grace_period,
            fallback_delay: fallback_delay(grace_period),
            pvc_cleanup,
            per_node_keys: PerNodeKeys::default(),
            unknown_recheck: check_interval(grace_period),
        }
    }
}

/// A point in time on both clocks: the monotonic one decides (immune to wall-clock steps), the
/// wall one is only printed ("missing since ...").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Now {
    /// Monotonic time.
    pub(crate) instant: Instant,
    /// Wall time.
    pub(crate) wall: jiff::Timestamp,
}

impl Now {
    /// The current time.
    pub(crate) fn system() -> Self {
        Self {
            instant: Instant::now(),
            wall: jiff::Timestamp::now(),
        }
    }

    /// This time plus `d` on both clocks (tests and timers).
    #[cfg(test)]
    pub(crate) fn after(self, d: Duration) -> Self {
        let wall = jiff::SignedDuration::try_from(d)
            .ok()
            .and_then(|sd| self.wall.checked_add(sd).ok())
            .unwrap_or(self.wall);
        Self {
            instant: self.instant + d,
            wall,
        }
    }
}
