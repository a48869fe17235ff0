//! client_golang's process collector (`process_*`), read from `/proc/self` at scrape time.
//!
//! Same names, types and help strings as upstream (no stability prefix: component-base registers
//! it raw). As there, a value that cannot be read is left out of the scrape rather than failing it.
//! Help strings get the `.` the registry would append (see `exposition`).

use std::fs;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Linux reports CPU times in `USER_HZ`, 100 on every architecture (prometheus/procfs assumes it
/// too).
const USER_HZ: f64 = 100.0;

/// Reads the process's figures on each scrape.
#[derive(Debug, Default)]
pub(crate) struct ProcessCollector;

/// One scrape's figures; `None` where `/proc` did not answer.
#[derive(Debug, Default, PartialEq)]
struct Figures {
    cpu_seconds: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
    virtual_bytes: Option<f64>,
    virtual_max_bytes: Option<f64>,
    resident_bytes: Option<f64>,
    start_time_seconds: Option<f64>,
    network_receive_bytes: Option<f64>,
    network_transmit_bytes: Option<f64>,
}

impl Figures {
    fn read() -> Self {
        let mut figures = Self::default();
        if let Ok(stat) = fs::read_to_string("/proc/self/stat")
            && let Some(stat) = parse_stat(&stat)
        {
            figures.cpu_seconds = Some((stat.utime + stat.stime) / USER_HZ);
            figures.virtual_bytes = Some(stat.vsize);
            figures.start_time_seconds = fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| boot_time(&s))
                .map(|boot| boot + stat.start_ticks / USER_HZ);
        }
        // VmRSS is the stat `rss` field in bytes, without asking for the page size.
        figures.resident_bytes = fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| status_kib(&s, "VmRSS:"))
            .map(|kib| kib * 1024.0);
        figures.open_fds = fs::read_dir("/proc/self/fd")
            .ok()
            .map(|entries| entries.count() as f64);
        if let Ok(limits) = fs::read_to_string("/proc/self/limits") {
            figures.max_fds = soft_limit(&limits, "Max open files");
            figures.virtual_max_bytes = soft_limit(&limits, "Max address space");
        }
        if let Ok(netstat) = fs::read_to_string("/proc/self/net/netstat") {
            figures.network_receive_bytes = ip_ext(&netstat, "InOctets");
            figures.network_transmit_bytes = ip_ext(&netstat, "OutOctets");
        }
        figures
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let f = Figures::read();
        let counters = [
            (
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                f.cpu_seconds,
            ),
            (
                "process_network_receive_bytes",
                "Number of bytes received by the process over the network.",
                f.network_receive_bytes,
            ),
            (
                "process_network_transmit_bytes",
                "Number of bytes sent by the process over the network.",
                f.network_transmit_bytes,
            ),
        ];
        let gauges = [
            (
                "process_open_fds",
                "Number of open file descriptors.",
                f.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                f.max_fds,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                f.virtual_bytes,
            ),
            (
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
                f.virtual_max_bytes,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                f.resident_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                f.start_time_seconds,
            ),
        ];
        for (kind, families) in [
            (MetricType::Counter, &counters[..]),
            (MetricType::Gauge, &gauges[..]),
        ] {
            for &(name, help, value) in families {
                let Some(value) = value else { continue };
                let metric = encoder.encode_descriptor(name, &format!("{help}."), None, kind)?;
                match kind {
                    MetricType::Counter => ConstCounter::new(value).encode(metric)?,
                    _ => ConstGauge::new(value).encode(metric)?,
                }
            }
        }
        Ok(())
    }
}

struct Stat {
    utime: f64,
    stime: f64,
    start_ticks: f64,
    vsize: f64,
}

/// `/proc/self/stat`: fields after the parenthesised command (which may hold spaces).
fn parse_stat(stat: &str) -> Option<Stat> {
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    // Field 3 (state) is at index 0.
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        start_ticks: field(22)?,
        vsize: field(23)?,
    })
}

fn boot_time(proc_stat: &str) -> Option<f64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

fn status_kib(status: &str, key: &str) -> Option<f64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.split_whitespace().next()?.parse().ok())
}

/// The soft limit of `name` in `/proc/self/limits`; `unlimited` is procfs's `MaxUint64`.
fn soft_limit(limits: &str, name: &str) -> Option<f64> {
    let soft = limits
        .lines()
        .find_map(|l| l.strip_prefix(name)?.split_whitespace().next())?;
    if soft == "unlimited" {
        Some(u64::MAX as f64)
    } else {
        soft.parse().ok()
    }
}

/// A field of the `IpExt:` lines of `/proc/self/net/netstat` (a header line, then values).
fn ip_ext(netstat: &str, field: &str) -> Option<f64> {
    let mut lines = netstat.lines().filter(|l| l.starts_with("IpExt:"));
    let names = lines.next()?;
    let values = lines.next()?;
    let index = names.split_whitespace().position(|n| n == field)?;
    values.split_whitespace().nth(index)?.parse().ok()
}

#[cfg(test)]
#[path = "process_tests.rs"]
mod tests;
