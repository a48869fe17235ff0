use super::*;
use std::collections::HashMap;

fn nodes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i}")).collect()
}

#[test]
fn the_same_key_and_instances_always_give_the_same_order() {
    let names = nodes(20);
    let a = rendezvous_order("pvc-1", names.iter().map(String::as_str));
    let mut reversed: Vec<&str> = names.iter().map(String::as_str).collect();
    reversed.reverse();
    let b = rendezvous_order("pvc-1", reversed);
    assert_eq!(
        a, b,
        "the order must not depend on the order instances were listed in"
    );
    assert_eq!(a.len(), 20);
}

#[test]
fn weights_are_pinned_so_every_version_agrees() {
    // If this changes, instances of two versions would pick different actors during an upgrade.
    assert_eq!(weight("", ""), fmix64(fnv1a64(&[&[0xFF]])));
    assert_eq!(fnv1a64(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
    assert_ne!(weight("ab", "c"), weight("a", "bc"));
}

#[test]
fn keys_spread_evenly_over_instances() {
    let names = nodes(10);
    let mut first: HashMap<&str, usize> = HashMap::new();
    for i in 0..10_000 {
        let key = format!("pvc-{i:08x}-volume");
        let order = rendezvous_order(&key, names.iter().map(String::as_str));
        *first.entry(order[0]).or_default() += 1;
    }
    assert_eq!(
        first.len(),
        10,
        "every instance must be chosen for some keys"
    );
    for (instance, count) in first {
        assert!(
            (700..=1300).contains(&count),
            "{instance} was chosen for {count} of 10000 keys; expected about 1000"
        );
    }
}

#[test]
fn removing_an_instance_moves_only_its_keys_to_their_second_choice() {
    let names = nodes(8);
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    let without: Vec<&str> = all.iter().copied().filter(|n| *n != "node-3").collect();
    for i in 0..2_000 {
        let key = format!("pv-{i}");
        let before = rendezvous_order(&key, all.iter().copied());
        let after = rendezvous_order(&key, without.iter().copied());
        if before[0] == "node-3" {
            assert_eq!(after[0], before[1], "the fallback is the next in order");
        } else {
            assert_eq!(after[0], before[0], "keys of other instances must not move");
        }
    }
}

#[test]
fn rank_of_matches_the_position_in_the_order() {
    let names = nodes(12);
    for key in ["pv-a", "pv-b", "csi.example.com/deleted-node-cleanup"] {
        let order = rendezvous_order(key, names.iter().map(String::as_str));
        for (pos, instance) in order.iter().enumerate() {
            assert_eq!(
                rank_of(key, instance, names.iter().map(String::as_str)),
                Some(pos)
            );
        }
    }
}

#[test]
fn an_instance_that_is_not_live_has_no_rank() {
    let names = nodes(3);
    assert_eq!(
        rank_of("pv", "node-9", names.iter().map(String::as_str)),
        None
    );
    assert_eq!(rank_of("pv", "node-0", std::iter::empty()), None);
}

#[test]
fn duplicate_instance_names_count_once() {
    let order = rendezvous_order("k", ["a", "b", "a", "b"]);
    assert_eq!(order.len(), 2);
    let rank_a = rank_of("k", "a", ["a", "b", "b"]).unwrap();
    let rank_b = rank_of("k", "b", ["a", "b", "a"]).unwrap();
    assert_eq!(rank_a + rank_b, 1);
}
