use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use kube::api::{Api, ListParams};
use kube_sim::{FaultRule, Sim, SimConfig};

use super::*;
use crate::model::secrets::SecretRef;
use crate::testing::pvc;

fn entry(volume: &str, retain: bool) -> Entry {
    let request = crate::csi::v1::CreateVolumeRequest {
        name: volume.to_owned(),
        ..Default::default()
    };
    Entry::new(
        &pvc("ns", volume).build(),
        &request,
        Some(&SecretRef::new("creds", "vault")),
        retain,
    )
}

/// The volumes the ledger's Leases hold on the API server.
async fn written(client: &kube::Client) -> Vec<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let list = leases.list(&ListParams::default()).await.unwrap();
    let mut volumes: Vec<String> = list
        .items
        .iter()
        .flat_map(|l| super::lease_entries(l).unwrap_or_default())
        .map(|e| e.volume)
        .collect();
    volumes.sort();
    volumes
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ledger `d` of namespace `default`, opened, with its committer running until the sender is
/// used.
async fn started(
    client: &kube::Client,
) -> (
    Ledger,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let ledger = Ledger::open(
        client.clone(),
        "default",
        "d",
        None,
        Arc::new(AtomicI64::new(0)),
    )
    .await
    .expect("the ledger opens");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let committer = tokio::spawn(ledger.clone().run_committer(
        crate::runtime::Leadership::always(),
        async {
            let _ = stop_rx.await;
        },
    ));
    (ledger, stop_tx, committer)
}

/// A removal waits for a quiet resolver pass (one with no intent recorded since the pass before);
/// a Retain removal is written at once, and when that write fails, again at the next pass (no
/// pause of its own, no retry loop meanwhile).
#[tokio::test]
async fn removals_are_written_by_the_resolvers_passes_and_a_failed_one_again() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let client = sim.client();
    let (ledger, stop_tx, committer) = started(&client).await;
    ledger.record(entry("pvc-a", false)).await.unwrap();
    ledger.record(entry("pvc-b", true)).await.unwrap();
    assert_eq!(written(&client).await, ["pvc-a", "pvc-b"]);

    // A Delete volume's removal waits for a pass.
    ledger.forget("pvc-a", Removal::Lazy);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        written(&client).await,
        ["pvc-a", "pvc-b"],
        "not written alone"
    );
    ledger.flush_removals();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        written(&client).await,
        ["pvc-a", "pvc-b"],
        "intents were recorded since the pass before: the removal rides their next write"
    );
    ledger.flush_removals();
    until("the quiet pass writes it", async || {
        written(&client).await == ["pvc-b"]
    })
    .await;

    // A Retain removal is written at once; when that write fails, the next pass writes it.
    let faults = sim.faults();
    let refused = faults.add(
        FaultRule::error(500)
            .verb("update")
            .resource("leases")
            .times(1),
    );
    ledger.forget("pvc-b", Removal::Prompt);
    until("the refused write", async || faults.hits(refused) == 1).await;
    let before = sim.counters();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        sim.counters().since(&before).writes_to(Some("leases")),
        0,
        "no retry loop of its own"
    );
    ledger.flush_removals();
    until("the next pass writes it", async || {
        written(&client).await.is_empty()
    })
    .await;

    let _ = stop_tx.send(());
    committer.await.unwrap();
}

/// A shard that another writer left unreadable is never overwritten (it may list volumes being
/// created): recording fails, naming the Lease, until it is deleted; then the shard is written
/// again with this process's entries.
#[tokio::test]
async fn a_shard_left_unreadable_is_not_overwritten_and_recording_fails_naming_it() {
    let sim = Sim::start(SimConfig::bare()).await.unwrap();
    let client = sim.client();
    let (ledger, stop_tx, committer) = started(&client).await;
    ledger.record(entry("pvc-a", false)).await.unwrap();

    // Someone else writes the shard in a form this version cannot read.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let shard = super::shard_name("d", 0);
    let mut lease = leases.get(&shard).await.unwrap();
    lease.metadata.annotations.get_or_insert_default().insert(
        crate::names::LEDGER_ENTRIES_ANNOTATION.to_owned(),
        "not a ledger".to_owned(),
    );
    leases
        .replace(&shard, &PostParams::default(), &lease)
        .await
        .unwrap();

    for volume in ["pvc-b", "pvc-c"] {
        let error = ledger.record(entry(volume, false)).await.unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("default/d-intents-0") && text.contains("it is not overwritten"),
            "{text}"
        );
        let kept = leases.get(&shard).await.unwrap();
        assert_eq!(
            kept.metadata.annotations.unwrap()[crate::names::LEDGER_ENTRIES_ANNOTATION],
            "not a ledger",
            "the unreadable shard is left as it is"
        );
    }

    // Deleted (the repair an operator makes once its volumes are accounted for): written again.
    leases.delete(&shard, &Default::default()).await.unwrap();
    ledger.record(entry("pvc-d", false)).await.unwrap();
    assert_eq!(written(&client).await, ["pvc-a", "pvc-b", "pvc-c", "pvc-d"]);

    let _ = stop_tx.send(());
    committer.await.unwrap();
}
