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
