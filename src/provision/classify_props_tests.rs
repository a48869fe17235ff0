//! Property tests of the retry-policy annotations (issue 41, item 6): a class's
//! `max-provisioning-failures` is text an admin writes. Any value gives a limit or the error that
//! names it; every positive limit printed reads back; the stop note stays bounded.

use proptest::prelude::*;

use super::*;
use crate::testing::sc;

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_limit_text_is_a_positive_count_or_named(value in prop_oneof![" ?[+-]?[0-9]{0,12} ?", "\\PC{0,10}"]) {
        let mut class = sc("gold").build();
        class.metadata.annotations = Some([(names::ANN_MAX_PROVISIONING_FAILURES.to_owned(), value.clone())].into());
        match max_failures(&class) {
            Ok(Some(n)) => prop_assert_eq!(value.trim().parse::<u32>(), Ok(n)),
            Ok(None) => prop_assert!(false, "an annotation is never no limit"),
            Err(err) => prop_assert!(err.starts_with("StorageClass gold: annotation ") && err.ends_with("retries forever"), "{err}"),
        }
    }

    #[test]
    fn a_printed_limit_reads_back(n in 1u32..) {
        let mut class = sc("gold").build();
        class.metadata.annotations = Some([(names::ANN_MAX_PROVISIONING_FAILURES.to_owned(), n.to_string())].into());
        prop_assert_eq!(max_failures(&class), Ok(Some(n)));
    }

    #[test]
    fn the_stop_note_keeps_at_most_512_characters_of_any_error(failures in any::<u32>(), error in "\\PC{0,700}") {
        let note = stopped_value(failures, &error);
        let kept = note.split_once("; last error: ").map(|(_, e)| e).unwrap_or_default();
        prop_assert!(kept.chars().count() <= 515, "{}", kept.chars().count());
        prop_assert!(error.starts_with(kept.trim_end_matches("...")));
    }
}
