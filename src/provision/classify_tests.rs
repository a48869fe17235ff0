use super::*;
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
fn replays_prove_absence_only_when_exact_and_final() {
    use ReplayVerdict::*;
    for code in ALL_CODES {
        let exact = replay_verdict(code, true);
        let minimal = replay_verdict(code, false);
        match code {
            Code::AlreadyExists => assert_eq!((exact, minimal), (NeedsAdmin, NeedsAdmin)),
            Code::InvalidArgument | Code::ResourceExhausted | Code::NotFound => {
                assert_eq!((exact, minimal), (VolumeAbsent, NeedsAdmin));
            }
            Code::Unauthenticated | Code::DeadlineExceeded | Code::Internal => {
                assert_eq!((exact, minimal), (RetryLater, RetryLater));
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
