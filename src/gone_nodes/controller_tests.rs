//! Tests of [`super`].

use super::*;
use crate::testing::{DRIVER, csinode, node};

#[test]
fn the_fingerprint_changes_when_a_node_or_an_instance_comes_goes_or_is_replaced() {
    let a = Arc::new(node("a").build());
    let b = Arc::new(node("b").build());
    let b2 = Arc::new(node("b").uid("uid-b2").build());
    let ca = Arc::new(csinode("a").driver(DRIVER, "a", ["k"]).build());
    let cb = Arc::new(csinode("b").driver(DRIVER, "b", ["k"]).build());
    let other = Arc::new(csinode("b").driver("other", "b", ["k"]).build());
    let base = fingerprint(&[a.clone(), b.clone()], &[ca.clone(), cb.clone()], DRIVER);
    assert_eq!(
        base,
        fingerprint(&[b.clone(), a.clone()], &[cb.clone(), ca.clone()], DRIVER)
    );
    assert_ne!(
        base,
        fingerprint(std::slice::from_ref(&a), &[ca.clone(), cb.clone()], DRIVER)
    );
    assert_ne!(
        base,
        fingerprint(&[a.clone(), b2], &[ca.clone(), cb.clone()], DRIVER)
    );
    assert_ne!(
        base,
        fingerprint(&[a.clone(), b.clone()], std::slice::from_ref(&ca), DRIVER)
    );
    assert_ne!(base, fingerprint(&[a, b], &[ca, other], DRIVER));
}
