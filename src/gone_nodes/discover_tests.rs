use super::*;
use crate::testing::{node, pv};

fn known(entries: &[(&str, &str, &[&str])]) -> KnownNodes {
    entries
        .iter()
        .map(|(name, uid, values)| {
            (
                (*name).to_owned(),
                (
                    Some((*uid).to_owned()),
                    values.iter().map(|v| (*v).to_owned()).collect(),
                ),
            )
        })
        .collect()
}

#[test]
fn vanished_and_replaced_nodes_make_their_label_values_suspect() {
    let before = known(&[
        ("a", "u1", &["a", "host-a"]),
        ("b", "u2", &["b"]),
        ("c", "u3", &["c"]),
    ]);
    let after = known(&[("b", "u2", &["b"]), ("c", "u4", &["c"])]);
    let gone: Vec<String> = vanished(&before, &after).into_iter().collect();
    assert_eq!(gone, vec!["a", "c", "host-a"]);
    assert!(vanished(&after, &after).is_empty());
}

#[test]
fn a_node_is_missing_when_absent_or_replaced_and_present_by_name_or_host_name() {
    let nodes = vec![
        Arc::new(node("n1").build()),
        Arc::new(node("n2").labels([(HOSTNAME_LABEL, "host-2")]).build()),
    ];
    let view = NodeView::new(&nodes);
    let keys = PerNodeKeys::default();
    let recorded = |name: &str, uid: &str| {
        pv("p")
            .node_affinity([(HOSTNAME_LABEL, name)])
            .annotation(names::ANN_NODE_NAME, name)
            .annotation(names::ANN_NODE_UID, uid)
            .build()
    };
    assert!(!node_missing(&recorded("n1", "uid-n1"), &keys, &view));
    assert!(
        node_missing(&recorded("n1", "uid-old"), &keys, &view),
        "replaced"
    );
    assert!(
        node_missing(&recorded("n3", "uid-n3"), &keys, &view),
        "gone"
    );
    let legacy = pv("p").node_affinity([(HOSTNAME_LABEL, "host-2")]).build();
    assert!(!node_missing(&legacy, &keys, &view));
    let shared = pv("p").build();
    assert!(!node_missing(&shared, &keys, &view), "no single node");

    assert!(view.present("n1", Some("uid-n1")));
    assert!(!view.present("n1", Some("uid-old")));
    assert!(view.present("host-2", None));
    assert!(!view.present("n3", None));
}

#[test]
fn pvs_of_missing_nodes_stay_suspect_by_label_value_or_by_name_when_unpinned() {
    let nodes = vec![Arc::new(node("n1").build())];
    let view = NodeView::new(&nodes);
    let keys = PerNodeKeys::default();
    let on = |name: &str, node: &str, label: &str| {
        pv(name)
            .annotation(names::ANN_NODE_NAME, node)
            .annotation(names::ANN_NODE_UID, &format!("uid-{node}"))
            .label(names::LABEL_PV_NODE, label)
            .build()
    };
    let mut still = StillMissing::default();
    still.note(&on("alive", "n1", "n1"), &keys, &view);
    still.note(&on("pinned", "gone", "gone"), &keys, &view);
    still.note(
        &on("unpinned", "gone", names::LABEL_VALUE_ANY_NODE),
        &keys,
        &view,
    );
    assert_eq!(still.values.into_iter().collect::<Vec<_>>(), vec!["gone"]);
    assert_eq!(still.pvs.into_iter().collect::<Vec<_>>(), vec!["unpinned"]);
}
