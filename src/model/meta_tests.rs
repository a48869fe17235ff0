use super::*;
use std::collections::BTreeMap;

#[test]
fn an_empty_annotation_is_stored_but_not_set() {
    let meta = ObjectMeta {
        annotations: Some(BTreeMap::from([
            ("empty".to_owned(), String::new()),
            ("full".to_owned(), "x".to_owned()),
        ])),
        ..ObjectMeta::default()
    };
    assert_eq!(annotation(&meta, "empty"), Some(""));
    assert_eq!(non_empty_annotation(&meta, "empty"), None);
    assert_eq!(non_empty_annotation(&meta, "full"), Some("x"));
    assert_eq!(annotation(&meta, "missing"), None);
    assert_eq!(annotation(&ObjectMeta::default(), "full"), None);
}
