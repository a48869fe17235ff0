use super::*;

#[test]
fn a_pv_skipped_for_lack_of_knowledge_is_looked_at_again_soon() {
    for reason in [SkipReason::ClaimUnknown, SkipReason::AttachmentsUnknown] {
        assert_eq!(
            after_skip(reason),
            Action::requeue(UNKNOWN_RETRY),
            "{reason:?}"
        );
    }
    for reason in [
        SkipReason::NotOurs,
        SkipReason::NeverBound,
        SkipReason::ClaimInUse { deleting: true },
        SkipReason::NotReleased,
        SkipReason::NotOnThisNode,
    ] {
        assert_eq!(after_skip(reason), Action::await_change(), "{reason:?}");
    }
}
