use super::*;
use crate::testing::{pvc, sc};
use ProvisioningState::*;

const ALL_CODES: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

/// Upstream `TestProvisionErrorHandling`: every code × (topology, node selected).
#[test]
fn every_grpc_code_maps_to_upstreams_state() {
    for code in ALL_CODES {
        for topology in [false, true] {
            for node in [None, Some("n1")] {
                let may = may_reschedule(topology, node);
                let want = match code {
                    Code::ResourceExhausted if topology && node.is_some() => Reschedule,
                    Code::Cancelled
                    | Code::DeadlineExceeded
                    | Code::Unavailable
                    | Code::Aborted => InBackground,
                    _ => Finished,
                };
                assert_eq!(
                    provisioning_state(code, may),
                    want,
                    "{code:?} topology={topology} node={node:?}"
                );
            }
        }
    }
}

#[test]
fn an_empty_selected_node_never_reschedules() {
    assert!(!may_reschedule(true, Some("")));
    assert!(!may_reschedule(false, Some("n1")));
}

#[test]
fn only_invalid_argument_is_infeasible() {
    for code in ALL_CODES {
        assert_eq!(is_infeasible(code), code == Code::InvalidArgument);
    }
    assert_eq!(
        infeasible_event_message("rpc error: bad size"),
        "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: bad size"
    );
}

#[test]
fn replays_prove_absence_only_when_final() {
    use ReplayVerdict::*;
    for code in ALL_CODES {
        let exact = replay_verdict(code);
        match code {
            Code::AlreadyExists => assert_eq!(exact, NeedsAdmin),
            Code::InvalidArgument | Code::ResourceExhausted | Code::NotFound => {
                assert_eq!(exact, VolumeAbsent);
            }
            Code::Unauthenticated | Code::DeadlineExceeded | Code::Internal => {
                assert_eq!(exact, RetryLater);
            }
            _ => {}
        }
        // Whatever may still be in progress is never taken as absence.
        if provisioning_state(code, false) == InBackground {
            assert_eq!(exact, RetryLater, "{code:?}");
        }
    }
    assert!(
        replay_needs_admin_message("pvc-1", "already exists")
            .contains("remove the finalizer csi-provisioner.rs/provisioning-intent")
    );
}

#[test]
fn state_strings_are_upstreams() {
    let all = [Finished, InBackground, NoChange, Reschedule].map(ProvisioningState::as_str);
    assert_eq!(all, ["Finished", "Background", "NoChange", "Reschedule"]);
}

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
