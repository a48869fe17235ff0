use super::*;

fn abandoned(volume_id: Option<&str>, replay: bool, exact: bool) -> IntentCleanup {
    IntentCleanup {
        volume_name: "pvc-1".to_owned(),
        volume_id: volume_id.map(str::to_owned),
        secret: None,
        replay: replay.then(|| CreateVolumeRequest {
            name: "pvc-1".to_owned(),
            ..CreateVolumeRequest::default()
        }),
        replay_is_exact: exact,
    }
}

#[test]
fn a_known_id_is_deleted_directly_without_a_replay() {
    assert_eq!(
        cleanup_step(&abandoned(Some("id-1"), true, true)),
        CleanupStep::DeleteVolume {
            volume_id: "id-1".to_owned(),
        }
    );
}

#[test]
fn without_an_id_the_create_is_replayed_and_without_a_request_the_intent_is_dropped() {
    assert!(matches!(
        cleanup_step(&abandoned(None, true, true)),
        CleanupStep::Replay(request) if request.name == "pvc-1"
    ));
    assert_eq!(
        cleanup_step(&abandoned(None, false, false)),
        CleanupStep::DropIntent
    );
}

#[test]
fn a_replay_answer_decides_between_delete_drop_and_retry() {
    let exact = abandoned(None, true, true);
    assert_eq!(
        after_replay(&exact, Ok("id-9")),
        AfterReplay::Delete("id-9".to_owned())
    );
    assert!(
        matches!(after_replay(&exact, Ok("")), AfterReplay::NoVolumeId(m) if m.contains("pvc-1"))
    );
    // An exact replay refused for good proves the original was refused too.
    assert_eq!(
        after_replay(&exact, Err((tonic::Code::InvalidArgument, "rpc error"))),
        AfterReplay::VolumeAbsent
    );
    // A minimal replay's refusal proves nothing; a transient error is retried.
    let minimal = abandoned(None, true, false);
    assert!(matches!(
        after_replay(&minimal, Err((tonic::Code::InvalidArgument, "rpc error"))),
        AfterReplay::Retry(_)
    ));
    assert!(matches!(
        after_replay(&exact, Err((tonic::Code::Unavailable, "rpc error: x"))),
        AfterReplay::Retry(m) if m.contains("will retry") && m.contains("rpc error: x")
    ));
}
