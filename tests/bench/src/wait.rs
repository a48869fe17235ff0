//! Condition waits with a deadline (never a fixed sleep).

use std::future::Future;
use std::time::Duration;

use anyhow::{Result, bail};

/// Polls `probe` until it returns `Some`, or fails naming `what` after `deadline`.
pub async fn wait_until<T, F, Fut>(what: &str, deadline: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(10);
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        if start.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
}

/// The machine counts as idle when at most this share of its CPU time was busy over [`PROBE`].
const IDLE_BUSY: f64 = 0.10;
/// How long one look at the machine's CPU time lasts.
const PROBE: Duration = Duration::from_millis(500);

/// Waits until the machine is idle, at most `deadline` (then the run starts anyway, with a
/// warning); returns how long it waited. The binaries run one after the other, so whatever one
/// run leaves winding down (processes exiting, the page cache written back) would otherwise slow
/// the next binary's run alone.
pub async fn machine_idle(deadline: Duration) -> Duration {
    let start = tokio::time::Instant::now();
    let idle = wait_until("an idle machine", deadline, || async {
        let Some(before) = cpu_ticks() else {
            return Some(());
        };
        tokio::time::sleep(PROBE).await;
        let after = cpu_ticks()?;
        let busy = after.0.saturating_sub(before.0) as f64;
        let total = after.1.saturating_sub(before.1).max(1) as f64;
        (busy / total <= IDLE_BUSY).then_some(())
    })
    .await;
    if let Err(e) = idle {
        eprintln!("bench: starting anyway: {e}");
    }
    start.elapsed()
}

/// The machine's busy and total CPU time so far, in ticks (`/proc/stat`). Steal time counts as
/// neither: it is the host's work, which waiting here cannot change. `None` where unreadable,
/// which ends the wait at once.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let [user, nice, system, idle, iowait, irq, softirq, ..] = ticks[..] else {
        return None;
    };
    let busy = user + nice + system + irq + softirq;
    Some((busy, busy + idle + iowait))
}
