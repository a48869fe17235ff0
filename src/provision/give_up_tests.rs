use super::*;
use crate::testing::{pvc, sc};

#[test]
fn the_limit_is_a_positive_integer_and_anything_else_is_named_and_ignored() {
    let class = |v: &str| {
        let mut c = sc("gold").build();
        c.metadata.annotations = Some(
            [(
                names::ANN_MAX_PROVISIONING_FAILURES.to_owned(),
                v.to_owned(),
            )]
            .into(),
        );
        c
    };
    assert_eq!(max_failures(&sc("plain").build()), Ok(None));
    assert_eq!(max_failures(&class("3")), Ok(Some(3)));
    for bad in ["0", "-1", "three", ""] {
        let err = max_failures(&class(bad)).unwrap_err();
        assert!(
            err.contains("StorageClass gold") && err.contains("retries forever"),
            "{err}"
        );
    }
}

#[test]
fn the_stop_is_kept_on_the_claim_with_a_bounded_reason() {
    let long = "x".repeat(2000);
    let value = stopped_value(3, &long);
    assert!(value.starts_with("stopped after 3 failed attempts; last error: xxx"));
    assert!(value.len() < 600 && value.ends_with("..."));
    let stopped = pvc("ns", "c")
        .annotation(names::ANN_PROVISIONING_STOPPED, &value)
        .build();
    assert!(is_stopped(&stopped) && !is_stopped(&pvc("ns", "c").build()));
    let msg = stopped_message("gold", 3, "out of quota");
    assert!(msg.contains("remove the claim's annotation csi-provisioner.rs/provisioning-stopped"));
}
