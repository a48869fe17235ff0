use super::abandoned_since;
use crate::testing::pvc;

#[test]
fn a_claim_is_abandoned_when_gone_replaced_or_being_deleted() {
    let read = pvc("ns", "data").uid("u1").build();
    assert!(!abandoned_since(&read, Some(&read)));
    assert!(abandoned_since(&read, None));
    assert!(abandoned_since(
        &read,
        Some(&pvc("ns", "data").uid("u2").build())
    ));
    assert!(abandoned_since(
        &read,
        Some(&pvc("ns", "data").uid("u1").deleting().build())
    ));
}
