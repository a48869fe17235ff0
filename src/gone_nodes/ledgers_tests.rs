use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn ledger(name: &str, node: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            resource_version: Some("7".to_owned()),
            annotations: Some([(LEDGER_NODE_ANNOTATION.to_owned(), node.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: None,
    }
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn only_ledgers_of_missing_nodes_wait_and_keep_their_first_missing_time() {
    let mut g = GoneLedgers::default();
    let t0 = Instant::now();
    let nodes = set(&["a"]);
    g.remember(
        vec![
            ledger("l-a-0", "a"),
            ledger("l-b-0", "b"),
            ledger("l-b-1", "b"),
        ],
        &nodes,
        t0,
    );
    assert_eq!(g.waiting.keys().collect::<Vec<_>>(), ["b"]);
    assert_eq!(g.waiting["b"].leases.len(), 2);
    let later = t0 + Duration::from_secs(5);
    g.remember(vec![ledger("l-b-0", "b")], &nodes, later);
    assert_eq!(
        g.waiting["b"].missing_since, t0,
        "the grace period does not start over"
    );
    // Back in the cache: no longer waits.
    g.remember(vec![ledger("l-b-0", "b")], &set(&["a", "b"]), later);
    assert!(g.waiting.is_empty());
}

/// The entries logged as gone with their node are those of the version deleted (the listed
/// one): no GET per shard, and nothing logged for a shard its node wrote again meanwhile.
#[test]
fn a_waiting_ledger_keeps_the_entries_of_the_version_it_will_delete() {
    let mut g = GoneLedgers::default();
    let mut lease = ledger("l-b-0", "b");
    lease.metadata.annotations.as_mut().unwrap().insert(
        LEDGER_ENTRIES_ANNOTATION.to_owned(),
        r#"[{"volume":"pvc-1","namespace":"ns","claim":"data","uid":"u","request":""}]"#.to_owned(),
    );
    g.remember(vec![lease], &set(&["a"]), Instant::now());
    let shard = &g.waiting["b"].leases[0];
    assert_eq!(
        (shard.name.as_str(), shard.version.as_str()),
        ("l-b-0", "7")
    );
    let volumes: Vec<&str> = shard.entries.iter().map(|e| e.volume.as_str()).collect();
    assert_eq!(volumes, ["pvc-1"]);
}

#[test]
fn lists_only_when_something_may_have_changed() {
    let grace = Duration::from_secs(60);
    let mut g = GoneLedgers::default();
    let t0 = Instant::now();
    let nodes = set(&["a", "b"]);
    assert!(g.list_due(&nodes, t0, grace), "first pass in the role");
    g.listed_at = Some(t0);
    g.nodes_at_list = nodes.clone();
    assert!(
        !g.list_due(&nodes, t0 + Duration::from_secs(1), grace),
        "idle: no request"
    );
    assert!(g.list_due(&set(&["a"]), t0, grace), "a node left");
    assert!(
        g.list_due(&nodes, t0 + SWEEP_INTERVAL, grace),
        "periodic sweep"
    );
    g.remember(vec![ledger("l-c-0", "c")], &nodes, t0);
    assert!(!g.list_due(&nodes, t0 + Duration::from_secs(1), grace));
    assert!(
        g.list_due(&nodes, t0 + grace, grace),
        "a gone node's grace period is over"
    );
    g.stand_down();
    assert!(g.list_due(&nodes, t0, grace));
}
