//! Lease-based leader election (`--leader-election`), compatible with upstream's so that our
//! replicas and upstream's contend for one Lease during a rolling upgrade in either direction.
//!
//! This module owns:
//! - [`decide`]: the pure rules (client-go's), the Lease name and identity sanitising;
//! - [`elector`]: the effectful loop that reads and writes the Lease on its own client (its own
//!   request budget), records upstream's events and metric, feeds `/healthz/leader-election`,
//!   and gives the lease up on graceful shutdown;
//! - feeding the guard the controllers check (`runtime::Leadership`): valid only until the last
//!   successful renewal's *start* plus the renew deadline, on the local monotonic clock.
//!
//! Standbys run their watches (warm caches); only the controllers wait for leadership. A leader
//! that loses its lease exits with status 1 as upstream does: its guard is already closed, and a
//! fresh process starts as a standby with no state left over from the lost term.

pub(crate) mod decide;
pub(crate) mod elector;

pub(crate) use elector::{LeaderElection, LeaderMetrics, lease_namespace, ledger_namespace};
