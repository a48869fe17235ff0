//! client-go's work-queue metrics (`workqueue_*`, label `name`), with upstream's names, help
//! strings and buckets, for the queues whose meaning matches one of upstream's.
//!
//! client-go creates a queue's series when the queue is built, before leader election, so every
//! series reads 0 from the first scrape: [`WorkQueueMetrics::queue`] creates them the same way and
//! the caller does so at start-up. The two in-progress gauges are computed at scrape time by a
//! collector, where client-go sets them from a 500 ms ticker: same meaning, never stale.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;

use super::meta::{Registrar, Stability};

/// Upstream's queue of claims to provision (sig-storage-lib's claim queue; our provision
/// controller).
pub(crate) const CLAIMS: &str = "claims";
/// Upstream's queue of PVs to delete (sig-storage-lib's volume queue; our reclaim controller).
pub(crate) const VOLUMES: &str = "volumes";
/// Upstream's capacity controller queue (only with `--enable-capacity`).
pub(crate) const CSISTORAGECAPACITY: &str = "csistoragecapacity";

type NameLabel = [(&'static str, String); 1];
type HistogramFamily = Family<NameLabel, Histogram, fn() -> Histogram>;

fn name_label(name: &str) -> NameLabel {
    [("name", name.to_owned())]
}

/// client-go's `ExponentialBuckets(10e-9, 10, 10)`: 10 ns to 10 s, by repeated multiplication
/// as Go computes them (so two bounds are `9.999999999999999e-06` and `…e-05`, as upstream's).
fn duration_histogram() -> Histogram {
    let bounds = std::iter::successors(Some(10e-9_f64), |b| Some(b * 10.0)).take(10);
    Histogram::new(bounds)
}

const UNFINISHED: &str = "workqueue_unfinished_work_seconds";
const UNFINISHED_HELP: &str = "[BETA] How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.";
const LONGEST: &str = "workqueue_longest_running_processor_seconds";
const LONGEST_HELP: &str =
    "[BETA] How many seconds has the longest running processor for workqueue been running.";

/// The work-queue families, registered once; one [`QueueMetrics`] per queue name.
#[derive(Debug, Clone)]
pub(crate) struct WorkQueueMetrics {
    depth: Family<NameLabel, Gauge>,
    adds: Family<NameLabel, Counter>,
    queue_duration: HistogramFamily,
    work_duration: HistogramFamily,
    retries: Family<NameLabel, Counter>,
    /// The runs in progress of each queue name, read by the scrape-time collector.
    running: Arc<Mutex<BTreeMap<String, Arc<RunStarts>>>>,
}

impl WorkQueueMetrics {
    /// Registers the seven families (BETA, as component-base registers them).
    pub(crate) fn register(registrar: &mut Registrar<'_>) -> Self {
        let metrics = Self {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(duration_histogram),
            work_duration: Family::new_with_constructor(duration_histogram),
            retries: Family::default(),
            running: Arc::default(),
        };
        let beta = Stability::Beta;
        registrar.register(
            beta,
            "workqueue_depth",
            "Current depth of workqueue",
            metrics.depth.clone(),
        );
        registrar.register(
            beta,
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            metrics.adds.clone(),
        );
        registrar.register(
            beta,
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested.",
            metrics.queue_duration.clone(),
        );
        registrar.register(
            beta,
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            metrics.work_duration.clone(),
        );
        registrar.register_collector(
            beta,
            2,
            Box::new(InProgress {
                running: metrics.running.clone(),
            }),
        );
        registrar.register(
            beta,
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            metrics.retries.clone(),
        );
        metrics
    }

    /// The metrics of the queue `name`, its series created now (at 0). Queues of one name share
    /// their series, as in client-go.
    pub(crate) fn queue(&self, name: &str) -> QueueMetrics {
        let label = name_label(name);
        let running = crate::sync::lock(&self.running)
            .entry(name.to_owned())
            .or_default()
            .clone();
        QueueMetrics {
            depth: self.depth.get_or_create(&label).clone(),
            adds: self.adds.get_or_create(&label).clone(),
            queue_duration: self.queue_duration.get_or_create(&label).clone(),
            work_duration: self.work_duration.get_or_create(&label).clone(),
            retries: self.retries.get_or_create(&label).clone(),
            running,
        }
    }
}

/// Start times of the runs in progress, by run id.
#[derive(Debug, Default)]
struct RunStarts {
    next_id: AtomicU64,
    started: Mutex<HashMap<u64, Instant>>,
}

/// The handles one queue updates; [`QueueMetrics::default`] is attached to no registry.
#[derive(Debug, Clone)]
pub(crate) struct QueueMetrics {
    depth: Gauge,
    adds: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    retries: Counter,
    running: Arc<RunStarts>,
}

impl Default for QueueMetrics {
    fn default() -> Self {
        Self {
            depth: Gauge::default(),
            adds: Counter::default(),
            queue_duration: duration_histogram(),
            work_duration: duration_histogram(),
            retries: Counter::default(),
            running: Arc::default(),
        }
    }
}

/// A run in progress, from [`QueueMetrics::started`].
#[derive(Debug)]
#[must_use = "pass it to QueueMetrics::finished"]
pub(crate) struct Run(u64);

impl QueueMetrics {
    /// An item entered the queue (client-go's Add of an item not already waiting).
    pub(crate) fn added(&self) {
        self.adds.inc();
        self.depth.inc();
    }

    /// An item added at `since` was handed to a worker (client-go's Get).
    pub(crate) fn taken(&self, since: Instant) {
        self.depth.dec();
        self.queue_duration.observe(since.elapsed().as_secs_f64());
    }

    /// A worker started on an item.
    pub(crate) fn started(&self) -> Run {
        let id = self.running.next_id.fetch_add(1, Ordering::Relaxed);
        crate::sync::lock(&self.running.started).insert(id, Instant::now());
        Run(id)
    }

    /// The worker of `run` is done (client-go's Done).
    pub(crate) fn finished(&self, run: Run) {
        if let Some(start) = crate::sync::lock(&self.running.started).remove(&run.0) {
            self.work_duration.observe(start.elapsed().as_secs_f64());
        }
    }

    /// An item was scheduled to run again later (client-go's AddAfter / AddRateLimited).
    pub(crate) fn retried(&self) {
        self.retries.inc();
    }

    /// Current depth (for tests).
    #[cfg(test)]
    pub(crate) fn depth(&self) -> i64 {
        self.depth.get()
    }
}

/// Computes the two in-progress gauges of every queue name when scraped (help with the `.` the
/// registry would append, see `exposition`).
#[derive(Debug)]
struct InProgress {
    running: Arc<Mutex<BTreeMap<String, Arc<RunStarts>>>>,
}

impl Collector for InProgress {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = Instant::now();
        let values: Vec<(NameLabel, f64, f64)> = crate::sync::lock(&self.running)
            .iter()
            .map(|(name, running)| {
                let started = crate::sync::lock(&running.started);
                let ages = started
                    .values()
                    .map(|start| now.saturating_duration_since(*start).as_secs_f64());
                let (sum, longest) = ages.fold((0.0, 0.0_f64), |(s, l), a| (s + a, l.max(a)));
                (name_label(name), sum, longest)
            })
            .collect();
        for (name, help, longest) in [
            (UNFINISHED, UNFINISHED_HELP, false),
            (LONGEST, LONGEST_HELP, true),
        ] {
            let help = format!("{help}.");
            let mut family = encoder.encode_descriptor(name, &help, None, MetricType::Gauge)?;
            for (label, sum, max) in &values {
                let value = if longest { *max } else { *sum };
                ConstGauge::new(value).encode(family.encode_family(label)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "workqueue_tests.rs"]
mod tests;
