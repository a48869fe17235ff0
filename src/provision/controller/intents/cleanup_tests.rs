use super::*;

/// The entry of volume `pvc-1`, with its volume id and its request as given.
fn abandoned(volume_id: Option<&str>, replay: bool) -> Entry {
    let request = CreateVolumeRequest {
        name: "pvc-1".to_owned(),
        ..CreateVolumeRequest::default()
    };
    let mut entry = Entry::new(
        &crate::testing::pvc("ns", "data").build(),
        &request,
        None,
        false,
    );
    entry.id = volume_id.map(str::to_owned);
    if !replay {
        entry.request.0.clear();
    }
    entry
}

#[test]
fn a_known_id_is_deleted_directly_without_a_replay() {
    assert_eq!(
        cleanup_step(&abandoned(Some("id-1"), true)),
        CleanupStep::DeleteVolume {
            volume_id: "id-1".to_owned(),
        }
    );
}

#[test]
fn without_an_id_the_create_is_replayed_and_without_a_request_the_volume_is_kept() {
    assert!(matches!(
        cleanup_step(&abandoned(None, true)),
        CleanupStep::Replay(request) if request.name == "pvc-1"
    ));
    assert_eq!(
        cleanup_step(&abandoned(None, false)),
        CleanupStep::KeepAndReport
    );
}

#[test]
fn a_replay_answer_decides_between_delete_drop_and_retry() {
    assert_eq!(
        after_replay("pvc-1", Ok("id-9")),
        AfterReplay::Delete("id-9".to_owned())
    );
    assert!(
        matches!(after_replay("pvc-1", Ok("")), AfterReplay::NoVolumeId(m) if m.contains("pvc-1"))
    );
    // The recorded request refused for good proves the original was refused too; a transient
    // error is retried.
    assert_eq!(
        after_replay("pvc-1", Err((tonic::Code::InvalidArgument, "rpc error"))),
        AfterReplay::VolumeAbsent
    );
    assert!(matches!(
        after_replay("pvc-1", Err((tonic::Code::Unavailable, "rpc error: x"))),
        AfterReplay::Retry(m) if m.contains("will retry") && m.contains("rpc error: x")
    ));
}
