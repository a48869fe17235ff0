//! Property tests of `--csi-address` (issue 41, item 6): any value parses or is refused with a
//! hint, and the socket path of an accepted address reads back in each form that can carry it.

use proptest::prelude::*;

use super::*;

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_address_parses_or_is_refused_with_a_hint(address in prop_oneof![
        " ?(unix:)?/{0,4}[a-z.]{0,6}(/[a-z.]{0,6})? ?",
        "(tcp|dns|http|unix)(:|://)[a-z0-9.:/]{0,10}",
        "\\PC{0,16}",
    ]) {
        match Endpoint::parse(&address) {
            Ok(endpoint) => {
                let path = endpoint.to_string();
                prop_assert!(!path.is_empty());
                // An absolute path reads back bare and as unix:///path; a relative one as unix:path.
                if path.starts_with('/') {
                    prop_assert_eq!(Endpoint::parse(&path), Ok(endpoint.clone()));
                    prop_assert_eq!(Endpoint::parse(&format!("unix://{path}")), Ok(endpoint));
                } else {
                    prop_assert_eq!(Endpoint::parse(&format!("unix:{path}")), Ok(endpoint));
                }
            }
            Err(err) => {
                let text = err.to_string();
                prop_assert!(text.starts_with("CSI address "), "{text}");
                prop_assert!(text.contains("--csi-address") || text.contains("/absolute/path") || text.contains("only /path"), "{text}");
            }
        }
    }
}
