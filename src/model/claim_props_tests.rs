//! Property tests of the unused-since annotation read back from claims (issue 41, item 6): any
//! value never panics, and a timestamp we write reads back as itself.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;

use super::*;

fn claim(since: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            annotations: Some([(names::ANN_UNUSED_SINCE.to_owned(), since.to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..PersistentVolumeClaim::default()
    }
}

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_unused_since_text_is_a_time_or_ignored(text in prop_oneof!["[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{0,12}(Z|[+-][0-9:]{0,5})?", "\\PC{0,30}"]) {
        if let Some((_, from)) = unused_since(&claim(&text)) {
            prop_assert_eq!(from, "annotation");
        }
    }

    #[test]
    fn a_written_timestamp_reads_back(seconds in -377_705_116_800i64..253_402_207_200, nanos in 0i32..1_000_000_000) {
        let at = jiff::Timestamp::new(seconds, nanos).expect("in range");
        prop_assert_eq!(unused_since(&claim(&at.to_string())), Some((at, "annotation")));
    }
}
