//! Child processes (kube-sim, mock drivers, provisioners) and their CPU time and memory from /proc.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use mock_csi_driver::ControlClient;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// /proc/PID/stat counts CPU time in USER_HZ ticks, which Linux fixes at 100 for user space.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time and memory of one process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcStats {
    /// User plus system CPU seconds since the process started.
    pub cpu_s: f64,
    /// Resident set now (VmRSS), KiB.
    pub rss_kib: u64,
    /// Peak resident set (VmHWM), KiB.
    pub hwm_kib: u64,
}

/// utime + stime in seconds from the text of /proc/PID/stat. The command name (field 2) may
/// hold spaces and parentheses, so fields are counted from the last ')'.
pub fn parse_stat_cpu(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')' come field 3 (state) onwards: utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / TICKS_PER_SECOND)
}

/// A `kB` line such as `VmHWM:   1234 kB` from the text of /proc/PID/status.
pub fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub fn read_stats(pid: u32) -> Option<ProcStats> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(ProcStats {
        cpu_s: parse_stat_cpu(&stat)?,
        rss_kib: parse_status_kib(&status, "VmRSS")?,
        hwm_kib: parse_status_kib(&status, "VmHWM")?,
    })
}

/// A running child; killed on drop.
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    pid: u32,
}

impl Proc {
    pub fn spawn(
        name: &str,
        bin: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Self> {
        let file = std::fs::File::create(log)
            .with_context(|| format!("create log file {}", log.display()))?;
        let child = Command::new(bin)
            .args(args)
            .envs(env.iter().cloned())
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {name} ({})", bin.display()))?;
        let pid = child.id().context("child pid")?;
        Ok(Self {
            name: name.into(),
            log: log.into(),
            child,
            pid,
        })
    }

    /// CPU and memory now; `None` once the process has exited.
    pub fn stats(&self) -> Option<ProcStats> {
        read_stats(self.pid)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails naming the process and the end of its log when it has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "{} exited ({status}); last log lines ({}):\n{}",
                self.name,
                self.log.display(),
                tail.join("\n")
            );
        }
        Ok(())
    }

    /// SIGKILL and reap.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// A `kube-sim` process and the kubeconfig it wrote.
pub struct KubeSim {
    /// Held so the process lives as long as this value (killed on drop).
    _proc: Proc,
    pub kubeconfig: PathBuf,
}

impl KubeSim {
    pub async fn start(bin: &Path, dir: &Path) -> Result<Self> {
        let kubeconfig = dir.join("kubeconfig");
        let log = dir.join("kube-sim.log");
        let mut child = Command::new(bin)
            .args([
                "--listen=127.0.0.1:0".to_string(),
                format!("--kubeconfig={}", kubeconfig.display()),
                // Room for every object of a 10,000-claim run, so no watch resume is refused.
                "--history-window=500000".to_string(),
            ])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start kube-sim ({})", bin.display()))?;
        let stdout = child.stdout.take().context("kube-sim stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("kube-sim did not say where it listens within 60 s")??
            .unwrap_or_default();
        if !first.contains("listening on") {
            bail!(
                "kube-sim printed {first:?} instead of its address; see {}",
                log.display()
            );
        }
        let pid = child.id().context("kube-sim pid")?;
        Ok(Self {
            _proc: Proc {
                name: "kube-sim".into(),
                log,
                child,
                pid,
            },
            kubeconfig,
        })
    }
}

/// Where this bench process keeps its Unix sockets: a short path under the temporary directory.
pub fn socket_root() -> PathBuf {
    std::env::temp_dir().join(format!("kube-bench-{}", std::process::id()))
}

/// A fresh directory for one driver's sockets.
fn socket_dir() -> Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = socket_root().join(n.to_string());
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    Ok(d)
}

/// A mock CSI driver process.
pub struct Driver {
    /// Held so the process lives as long as this value (killed on drop).
    _proc: Proc,
    pub socket: PathBuf,
    pub control: PathBuf,
}

impl Driver {
    pub async fn start(
        bin: &Path,
        dir: &Path,
        driver_name: &str,
        node: &str,
        topology: bool,
    ) -> Result<Self> {
        let topology = if topology {
            vec!["--topology".to_string()]
        } else {
            Vec::new()
        };
        Self::start_with(bin, dir, driver_name, node, &topology).await
    }

    /// [`Driver::start`] with `extra` flags (e.g. `--topology-node` for each further node).
    pub async fn start_with(
        bin: &Path,
        dir: &Path,
        driver_name: &str,
        node: &str,
        extra: &[String],
    ) -> Result<Self> {
        let base = dir.join(format!("driver-{node}"));
        std::fs::create_dir_all(&base)?;
        // Unix socket paths must be short (108 bytes), so they live apart from the work directory.
        let sockets = socket_dir()?;
        let socket = sockets.join("csi.sock");
        let control = sockets.join("control.sock");
        let mut args = vec![
            format!("--endpoint=unix://{}", socket.display()),
            format!("--drivername={driver_name}"),
            format!("--nodeid={node}"),
            format!("--control={}", control.display()),
            // The default 1Ti pool holds only 1024 of the bench's 1Gi volumes.
            "--capacity-total=1Pi".to_string(),
        ];
        args.extend(extra.iter().cloned());
        let env = [("RUST_LOG".to_string(), "warn".to_string())];
        let proc = Proc::spawn(
            &format!("mock-csi-driver {node}"),
            bin,
            &args,
            &env,
            &base.join("driver.log"),
        )?;
        let mut d = Self {
            _proc: proc,
            socket,
            control,
        };
        // Accepting connections, not merely bound: the socket file appears before `listen`.
        let start = std::time::Instant::now();
        while ControlClient::connect(&d.control).await.is_err() {
            d._proc.check_alive()?;
            if start.elapsed() > Duration::from_secs(120) {
                bail!(
                    "the mock driver's control socket {} did not answer within 120 s",
                    d.control.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(d)
    }

    /// Calls, pools and volumes now.
    pub async fn state(&self) -> Result<mock_csi_driver::StateDump> {
        let c = ControlClient::connect(&self.control).await?;
        Ok(c.state().await?)
    }

    /// Volumes the driver holds now.
    pub async fn volumes(&self) -> Result<Vec<String>> {
        let c = ControlClient::connect(&self.control).await?;
        let state = c.state().await?;
        Ok(state.volumes.into_iter().map(|v| v.name).collect())
    }
}

/// The first line `BIN --version` prints (stdout or stderr), or why there is none.
pub async fn version_of(bin: &Path) -> String {
    match Command::new(bin).arg("--version").output().await {
        Ok(out) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            text.lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("(no version printed)")
                .trim()
                .to_string()
        }
        Err(e) => format!("(cannot run --version: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_counts_from_the_last_parenthesis() {
        let stat =
            "4242 (csi (prov) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 8 0 100 0 0";
        assert_eq!(parse_stat_cpu(stat), Some(3.0));
        assert_eq!(parse_stat_cpu("garbage"), None);
    }

    #[test]
    fn status_lines_in_kib() {
        let status = "Name:\tx\nVmHWM:\t   65536 kB\nVmRSS:\t   1024 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(65536));
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(1024));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
    }

    #[test]
    fn own_process_has_stats() {
        let s = read_stats(std::process::id()).expect("own /proc entry");
        assert!(s.hwm_kib >= s.rss_kib && s.rss_kib > 0);
    }
}
