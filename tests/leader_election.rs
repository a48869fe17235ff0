//! Leader election end to end: several replicas of the sidecar, each with its own mock driver (as
//! each pod of a Deployment has its own driver container), contend for one Lease in kube-sim.
//! Who acted is read from the drivers: their call counts and their logs' CreateVolume times.
//!
//! Timings are short (lease 4s, renew deadline 3s, retry 0.5s) so failovers take seconds; the
//! renew deadline still leaves a loaded machine time to renew, and the 1s between renew deadline
//! and lease duration is the safety margin the timing checks rely on.

mod common;

use std::time::Duration;

use common::*;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_sim::FaultRule;
use tokio::time::Instant;

/// `mock.csi.rs` with every character outside `[a-zA-Z0-9-]` replaced, as upstream names it.
const LEASE: &str = "mock-csi-rs";
const LEASE_DURATION: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY_PERIOD: Duration = Duration::from_millis(500);
/// Scheduling slack on a loaded 2-core machine, added to every timing bound.
const SLACK: Duration = Duration::from_millis(1500);

fn election_flags() -> Vec<&'static str> {
    vec![
        "--leader-election",
        "--leader-election-namespace=default",
        "--leader-election-lease-duration=4s",
        "--leader-election-renew-deadline=3s",
        "--leader-election-retry-period=500ms",
        "--leader-election-labels=app:csi-provisioner",
        "--http-endpoint=127.0.0.1:0",
    ]
}

struct Replica {
    id: String,
    driver: Driver,
    sidecar: Sidecar,
}

impl Replica {
    async fn start(cluster: &Cluster, id: &str) -> Self {
        let driver = Driver::start(cluster.dir.path(), id, &[]).await;
        let sidecar = Sidecar::start_named(
            cluster,
            &driver,
            &format!("sidecar-{id}"),
            &election_flags(),
            // The holder identity is the host name (the pod name in a cluster).
            &[("HOSTNAME", id)],
        )
        .await;
        Self {
            id: id.to_owned(),
            driver,
            sidecar,
        }
    }

    async fn creates(&self) -> u64 {
        self.driver.state().await.calls("CreateVolume")
    }

    async fn deletes(&self) -> u64 {
        self.driver.state().await.calls("DeleteVolume")
    }

    /// Wall-clock times of this replica's driver creating or returning a volume.
    fn create_times(&self) -> Vec<Timestamp> {
        log_times(&self.driver.log(), "CreateVolume: ")
    }
}

async fn start_replicas(cluster: &Cluster, ids: &[&str]) -> Vec<Replica> {
    let mut replicas = Vec::new();
    for id in ids {
        replicas.push(Replica::start(cluster, id).await);
    }
    replicas
}

fn leases(cluster: &Cluster) -> Api<Lease> {
    Api::namespaced(cluster.client.clone(), "default")
}

async fn lease(cluster: &Cluster) -> Option<Lease> {
    leases(cluster)
        .get_opt(LEASE)
        .await
        .expect("read the Lease")
}

fn holder(lease: &Lease) -> &str {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("")
}

/// Waits until the Lease names one of `candidates` and returns its index.
async fn wait_holder(cluster: &Cluster, candidates: &[&str]) -> usize {
    wait_for(
        &format!("the Lease to be held by one of {candidates:?}"),
        DEADLINE,
        || async {
            let lease = lease(cluster).await?;
            candidates.iter().position(|c| *c == holder(&lease))
        },
    )
    .await
}

/// Polls the Lease every 10ms until `until` holds for it; returns the Lease and when.
async fn poll_lease(
    cluster: &Cluster,
    what: &str,
    mut until: impl FnMut(&Lease) -> bool,
) -> (Lease, Instant) {
    let start = Instant::now();
    loop {
        if let Some(l) = lease(cluster).await
            && until(&l)
        {
            return (l, Instant::now());
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The timestamps of the log lines containing `needle` (tracing's default format starts each line
/// with an RFC 3339 time, possibly wrapped in colour codes).
fn log_times(log: &str, needle: &str) -> Vec<Timestamp> {
    log.lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| {
            let plain = strip_ansi(l);
            plain.split_whitespace().next()?.parse().ok()
        })
        .collect()
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI sequence: ESC [ ... letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Exactly one of `n` replicas creates and deletes volumes: the Lease's holder.
async fn only_the_leader_acts(n: usize) {
    let cluster = Cluster::start().await;
    let ids: Vec<String> = (0..n).map(|i| format!("replica-{i}")).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let replicas = start_replicas(&cluster, &id_refs).await;
    let leader = wait_holder(&cluster, &id_refs).await;

    cluster.add_class(&storage_class("fast", &[])).await;
    for i in 0..4 {
        cluster
            .claim_of_class("default", &format!("c{i}"), "fast", "1Gi")
            .await;
    }
    for i in 0..4 {
        cluster.wait_bound("default", &format!("c{i}")).await;
    }
    cluster.delete_pvc_and_wait("default", "c0").await;
    wait_for("the deleted claim's volume to go", DEADLINE, || async {
        (replicas[leader].driver.state().await.volumes.len() == 3).then_some(())
    })
    .await;

    let now = lease(&cluster).await.expect("Lease");
    assert_eq!(
        (
            holder(&now),
            now.spec.as_ref().and_then(|s| s.lease_transitions)
        ),
        (id_refs[leader], Some(0)),
        "the leadership changed during the test (renewals starved on an overloaded machine?)"
    );
    for (i, r) in replicas.iter().enumerate() {
        let (creates, deletes) = (r.creates().await, r.deletes().await);
        if i == leader {
            assert_eq!((creates, deletes), (4, 1), "the leader {} acts", r.id);
        } else {
            assert_eq!((creates, deletes), (0, 0), "standby {} must not act", r.id);
            // Warm caches: a standby's watches ran and it only waits for the Lease (a standby
            // started last may still be filling them on a loaded machine).
            r.sidecar
                .wait_log(&["caches filled; waiting for leadership"], 1)
                .await;
            assert_eq!(
                r.sidecar
                    .log_lines_with(&["caches filled; waiting for leadership"]),
                1
            );
            assert_eq!(r.sidecar.log_lines_with(&["starting controllers"]), 0);
        }
    }
    // The Lease is written as client-go writes it, with the labels from the flag.
    let lease = lease(&cluster).await.expect("Lease");
    let spec = lease.spec.as_ref().expect("spec");
    assert_eq!(spec.lease_duration_seconds, Some(4));
    assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());
    assert!(spec.lease_transitions.is_some());
    assert_eq!(
        lease
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .map(String::as_str),
        Some("csi-provisioner")
    );
    assert!(
        cluster
            .event_count("Lease", "default", LEASE, "LeaderElection")
            .await
            >= 1,
        "upstream's `<identity> became leader` event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_replicas_only_the_leader_acts() {
    only_the_leader_acts(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_three_replicas_only_the_leader_acts() {
    only_the_leader_acts(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_within_the_lease_duration() {
    let cluster = Cluster::start().await;
    let mut replicas = start_replicas(&cluster, &["replica-a", "replica-b"]).await;
    let leader = wait_holder(&cluster, &["replica-a", "replica-b"]).await;
    let standby = 1 - leader;
    cluster.claim_with_fast_class("default", "before").await;
    cluster.wait_bound("default", "before").await;
    let transitions = lease(&cluster)
        .await
        .and_then(|l| l.spec?.lease_transitions)
        .unwrap_or(0);

    replicas[leader].sidecar.kill().await;
    let killed = Instant::now();
    cluster
        .claim_of_class("default", "after", "fast", "1Gi")
        .await;
    let standby_id = replicas[standby].id.clone();
    let (taken, at) = poll_lease(&cluster, "the standby to take over", |l| {
        holder(l) == standby_id
    })
    .await;
    let takeover = at - killed;
    eprintln!("take-over {takeover:?} after kill -9 (lease duration {LEASE_DURATION:?})");
    // The standby waits a lease duration after the last renewal it saw, then tries within a
    // retry period.
    assert!(
        takeover <= LEASE_DURATION + RETRY_PERIOD + SLACK,
        "take-over took {takeover:?}"
    );
    assert_eq!(
        taken.spec.and_then(|s| s.lease_transitions),
        Some(transitions + 1)
    );
    cluster.wait_bound("default", "after").await;
    let provisioned = killed.elapsed();
    eprintln!("claim created after the kill bound {provisioned:?} after it");
    assert_eq!(replicas[standby].creates().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_lease_and_a_standby_takes_over_within_a_retry_period() {
    let cluster = Cluster::start().await;
    let mut replicas = start_replicas(&cluster, &["replica-a", "replica-b"]).await;
    let leader = wait_holder(&cluster, &["replica-a", "replica-b"]).await;
    let standby = 1 - leader;
    let standby_id = replicas[standby].id.clone();

    replicas[leader].sidecar.terminate().await;
    let mut released = None;
    let (_, taken) = poll_lease(&cluster, "the standby to take over", |l| {
        if holder(l).is_empty() && released.is_none() {
            released = Some(Instant::now());
        }
        holder(l) == standby_id
    })
    .await;
    // Seen released, or already taken by the time of the first poll after the release.
    let released = released.unwrap_or(taken);
    let takeover = taken - released;
    eprintln!("take-over {takeover:?} after the release (retry period {RETRY_PERIOD:?})");
    assert!(
        takeover <= RETRY_PERIOD + SLACK,
        "take-over took {takeover:?}"
    );
    let code = replicas[leader].sidecar.wait_exit().await;
    assert_eq!(code, Some(0), "{}", replicas[leader].sidecar.log());
    assert_eq!(
        replicas[leader]
            .sidecar
            .log_lines_with(&["Released the lease"]),
        1
    );
    cluster.claim_with_fast_class("default", "after").await;
    cluster.wait_bound("default", "after").await;
    assert_eq!(replicas[standby].creates().await, 1);
    assert_eq!(replicas[leader].creates().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_stops_acting_before_another_starts() {
    let cluster = Cluster::start().await;
    let mut replicas = start_replicas(&cluster, &["replica-a", "replica-b"]).await;
    let leader = wait_holder(&cluster, &["replica-a", "replica-b"]).await;
    let standby = 1 - leader;
    cluster.add_class(&storage_class("fast", &[])).await;

    // Claims keep arriving, so the leader has work right up to the moment it must stop.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let creator = {
        let pvcs = cluster.pvcs("default");
        tokio::spawn(async move {
            let mut n = 0;
            loop {
                let c = claim("default", &format!("burst-{n}"), "fast", "1Gi");
                pvcs.create(&Default::default(), &c)
                    .await
                    .expect("create claim");
                n += 1;
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stop_rx.wait_for(|s| *s) => return n,
                }
            }
        })
    };
    wait_for("the leader to create volumes", DEADLINE, || async {
        (replicas[leader].creates().await >= 3).then_some(())
    })
    .await;

    // Every Lease write fails from now on: the leader can no longer renew.
    let fault = cluster.sim().faults().add(
        FaultRule::error(500)
            .verb("update")
            .resource("leases")
            .name(LEASE),
    );
    replicas[leader]
        .sidecar
        .wait_log(&["Failed to renew lease"], 1)
        .await;
    let last_renewal = lease(&cluster)
        .await
        .and_then(|l| l.spec?.renew_time)
        .expect("the leader's last renewal")
        .0;
    // The standby may take over once the lease is expired by its own count (a lease duration
    // after it saw that renewal): let its writes through from that moment, not later, so that a
    // leader acting past its lease would overlap with the new one.
    let expiry = last_renewal + jiff::SignedDuration::try_from(LEASE_DURATION).unwrap();
    let until_expiry = Timestamp::now().duration_until(expiry);
    if let Ok(wait) = Duration::try_from(until_expiry) {
        tokio::time::sleep(wait).await;
    }
    cluster.sim().faults().remove(fault);
    assert_eq!(
        replicas[leader].sidecar.wait_exit().await,
        Some(1),
        "a leader that lost its lease exits, as upstream"
    );
    assert_eq!(
        replicas[leader]
            .sidecar
            .log_lines_with(&["Stopped leading"]),
        1
    );

    let standby_id = replicas[standby].id.clone();
    wait_holder(&cluster, &[&standby_id]).await;
    wait_for("the new leader to create volumes", DEADLINE, || async {
        (replicas[standby].creates().await >= 3).then_some(())
    })
    .await;
    let _ = stop_tx.send(true);
    let created = creator.await.unwrap();
    for n in 0..created {
        cluster.wait_bound("default", &format!("burst-{n}")).await;
    }

    let old = replicas[leader].create_times();
    let new = replicas[standby].create_times();
    let old_last = *old.iter().max().expect("the old leader created volumes");
    let new_first = *new.iter().min().expect("the new leader created volumes");
    eprintln!(
        "old leader: {} creates, last at {old_last}; its last renewal started {last_renewal}; new leader's first create at {new_first}",
        old.len()
    );
    assert!(
        old_last < new_first,
        "overlapping terms: the old leader created at {old_last}, the new one already at {new_first}"
    );
    // It stopped before its lease could expire for anyone else (the lease duration after its last
    // renewal started), which is what makes the order above hold whatever the timing.
    assert!(
        old_last < expiry,
        "the old leader acted at {old_last}, after its lease could expire at {expiry}"
    );
    let margin = expiry.duration_since(old_last);
    eprintln!(
        "stopped {margin:#} before its lease could expire (renew deadline {RENEW_DEADLINE:?})"
    );
}

/// Ours and upstream's sidecar contend for one Lease: each reads the other's record and never
/// both act. Needs the upstream binary (`UPSTREAM_PROVISIONER`, a JSON-wire build, see docs/benchmarks.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_and_upstreams_sidecar_share_one_lease() {
    let Ok(upstream) = std::env::var("UPSTREAM_PROVISIONER") else {
        eprintln!(
            "skipped: set UPSTREAM_PROVISIONER to an upstream csi-provisioner binary built for JSON to run this test"
        );
        return;
    };
    let cluster = Cluster::start().await;
    let upstream_driver = Driver::start(cluster.dir.path(), "upstream", &[]).await;
    let start_upstream = || {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(cluster.dir.path().join("upstream.log"))
            .expect("upstream log");
        let mut args = vec![
            format!("--kubeconfig={}", cluster.kubeconfig.display()),
            format!("--csi-address={}", upstream_driver.socket.display()),
            "--v=5".to_owned(),
        ];
        args.extend(
            election_flags()
                .into_iter()
                .filter(|f| !f.starts_with("--http-endpoint"))
                .map(str::to_owned),
        );
        tokio::process::Command::new(&upstream)
            .args(args)
            .env_remove("KUBECONFIG")
            .env_remove("POD_NAMESPACE")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the upstream sidecar")
    };
    let upstream_log =
        || std::fs::read_to_string(cluster.dir.path().join("upstream.log")).unwrap_or_default();
    let upstream_creates = || async { upstream_driver.state().await.calls("CreateVolume") };

    // Upstream leads first; ours waits beside it.
    let mut theirs = start_upstream();
    let their_id = wait_for("upstream to take the Lease", DEADLINE, || async {
        let l = lease(&cluster).await?;
        let h = holder(&l).to_owned();
        (!h.is_empty()).then_some(h)
    })
    .await;
    eprintln!("upstream holds the Lease as {their_id:?}");
    let ours = Replica::start(&cluster, "ours").await;
    ours.sidecar
        .wait_log(&["caches filled; waiting for leadership"], 1)
        .await;
    cluster.claim_with_fast_class("default", "c1").await;
    cluster.wait_bound("default", "c1").await;
    assert_eq!(
        (upstream_creates().await, ours.creates().await),
        (1, 0),
        "upstream leads, ours stands by"
    );

    // Upstream dies: ours reads its Lease as expired and takes over.
    theirs.kill().await.unwrap();
    wait_holder(&cluster, &["ours"]).await;
    cluster.claim_of_class("default", "c2", "fast", "1Gi").await;
    cluster.wait_bound("default", "c2").await;
    assert_eq!((upstream_creates().await, ours.creates().await), (1, 1));

    // Upstream comes back as a standby of ours; ours shuts down gracefully and releases; upstream
    // takes the released Lease.
    let mut theirs = start_upstream();
    wait_for("upstream to wait for the Lease", DEADLINE, || async {
        upstream_log()
            .matches("Attempting to acquire leader lease")
            .count()
            .ge(&2)
            .then_some(())
    })
    .await;
    cluster.claim_of_class("default", "c3", "fast", "1Gi").await;
    cluster.wait_bound("default", "c3").await;
    assert_eq!((upstream_creates().await, ours.creates().await), (1, 2));
    ours.sidecar.terminate().await;
    let back = wait_holder(&cluster, &[&their_id]).await;
    assert_eq!(back, 0);
    cluster.claim_of_class("default", "c4", "fast", "1Gi").await;
    cluster.wait_bound("default", "c4").await;
    assert_eq!((upstream_creates().await, ours.creates().await), (2, 2));
    let spec = lease(&cluster).await.and_then(|l| l.spec).expect("Lease");
    eprintln!(
        "final Lease: holder {:?}, transitions {:?}",
        spec.holder_identity, spec.lease_transitions
    );
    // Created by upstream (0), taken over by ours (1), then by upstream again (2).
    assert_eq!(spec.lease_transitions, Some(2));
    let _ = theirs.kill().await;
}

/// The election has a request budget of its own: a leader whose workers have used up the
/// `--kube-api-qps` token bucket still renews its lease on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_worker_rate_limit_does_not_cost_the_lease() {
    let cluster = Cluster::start().await;
    let driver = Driver::start(cluster.dir.path(), "replica-a", &[]).await;
    let mut flags = election_flags();
    // Each claim costs the workers about six requests: 40 claims keep a 3/s bucket busy for over
    // a minute, while a renewal every 0.5s needs 2/s of the election's own bucket.
    flags.extend(["--kube-api-qps=3", "--kube-api-burst=3"]);
    let sidecar = Sidecar::start_named(
        &cluster,
        &driver,
        "sidecar-replica-a",
        &flags,
        &[("HOSTNAME", "replica-a")],
    )
    .await;
    wait_holder(&cluster, &["replica-a"]).await;
    cluster.add_class(&storage_class("fast", &[])).await;
    for i in 0..40 {
        cluster
            .claim_of_class("default", &format!("c{i}"), "fast", "1Gi")
            .await;
    }
    let transitions = lease(&cluster)
        .await
        .and_then(|l| l.spec?.lease_transitions);
    // Two lease durations of saturation: renewals stuck behind the workers' requests would
    // have missed the renew deadline twice over.
    let start = Instant::now();
    let mut renewals = std::collections::BTreeSet::new();
    while start.elapsed() < 2 * LEASE_DURATION {
        let l = lease(&cluster).await.expect("Lease");
        assert_eq!(holder(&l), "replica-a");
        if let Some(t) = l.spec.and_then(|s| s.renew_time) {
            renewals.insert(t.0);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bound = cluster
        .pvcs("default")
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
        .count();
    eprintln!(
        "{} renewals seen in {:?}; {bound} of 40 claims bound meanwhile",
        renewals.len(),
        2 * LEASE_DURATION
    );
    assert!(
        bound < 40,
        "the workers' budget was not saturated; the test proves nothing"
    );
    assert!(
        renewals.len() >= 6,
        "renewals went on while the workers were throttled"
    );
    assert_eq!(
        lease(&cluster)
            .await
            .and_then(|l| l.spec?.lease_transitions),
        transitions
    );
    assert_eq!(sidecar.log_lines_with(&["Failed to renew lease"]), 0);
    assert!(sidecar.pid().is_some(), "the leader still runs");
}

/// The intent ledger belongs to the driver, not to a replica: a leader killed while its
/// `CreateVolume` was in flight leaves an entry, and the replica that takes over finishes it
/// (here the claim was deleted meanwhile, so the volume is deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_finishes_the_intents_its_predecessor_left() {
    let cluster = Cluster::start().await;
    let mut first = Replica::start(&cluster, "replica-a").await;
    wait_holder(&cluster, &["replica-a"]).await;
    first.driver.creates_then_times_out().await;
    cluster.claim_with_fast_class("default", "data").await;
    cluster.wait_intent("default", "data", true).await;
    first.driver.wait_volumes(1).await;
    first.sidecar.kill().await;
    cluster.delete_pvc_and_wait("default", "data").await;

    let second = Replica::start(&cluster, "replica-b").await;
    wait_holder(&cluster, &["replica-b"]).await;
    cluster.wait_intent("default", "data", false).await;
    // The new leader learned the id by replaying the recorded CreateVolume on its driver, then
    // deleted that volume.
    let state = second.driver.wait_volumes(0).await;
    assert_eq!(state.calls("CreateVolume"), 1, "one replay");
    assert_eq!(state.ok_calls("DeleteVolume"), 1);
    assert_eq!(cluster.pv_count().await, 0);
}
