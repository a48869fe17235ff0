//! Property tests of `--vmodule` (issue 41, item 6): the flag's value is operator text. Parsing
//! must never panic, must fail only with component-base's two texts, and must read back a list
//! printed as `pattern=N,...`; matching must never panic and must answer quickly.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

/// Text near the flag's grammar (commas, equals, digits, globs) plus arbitrary strings.
fn arb_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(
            prop_oneof![
                "[a-z*?\\[\\]^\\\\-]{0,6}=[0-9]{0,11}",
                "[a-z=+-]{0,4}=?[0-9a-z +-]{0,4}",
                Just(String::new()),
            ],
            0..5,
        )
        .prop_map(|items| items.join(",")),
        1 => "[a-z0-9=,*\\PC]{0,20}",
        1 => any::<String>(),
    ]
}

/// The quoted item and the body of each of component-base's errors for one item.
fn upstreams_text(text: &str) -> bool {
    if let Some(quoted) = text.strip_suffix(" does not have the pattern=N format") {
        return quoted.starts_with('"') && quoted.ends_with('"') && quoted.len() >= 2;
    }
    text.starts_with("parsing verbosity in \"")
        && text.contains("\": strconv.ParseUint: parsing \"")
        && (text.ends_with("\": invalid syntax") || text.ends_with("\": value out of range"))
}

/// Glob-ish patterns: every glob character, escapes and classes, weighted to stars.
fn arb_pattern() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            3 => Just("*".to_owned()),
            2 => "[a-c]",
            1 => prop::sample::select(vec!["?", "[", "]", "^", "-", "\\", "[a-c]", "[^b]", "\\*", "é"]).prop_map(str::to_owned),
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_value_parses_or_gets_component_bases_error(text in arb_value()) {
        match parse_vmodule(&text) {
            Ok(list) => {
                let items: Vec<&str> = text.split(',').filter(|i| !i.is_empty()).collect();
                prop_assert_eq!(list.0.len(), items.len());
                for item in &list.0 {
                    prop_assert!(!item.pattern.is_empty() && !item.pattern.contains([',', '=']));
                    prop_assert!(item.level < 1 << 31);
                }
            }
            Err(err) => prop_assert!(upstreams_text(&err), "{text:?}: {err}"),
        }
    }

    #[test]
    fn a_printed_list_parses_back(
        items in prop::collection::vec(("[^,=]{1,12}", 0u32..1 << 31), 0..6),
    ) {
        let list = VModuleList(items.into_iter().map(|(pattern, level)| VModuleItem { pattern, level }).collect());
        let text: Vec<String> = list.0.iter().map(|i| format!("{}={}", i.pattern, i.level)).collect();
        prop_assert_eq!(parse_vmodule(&text.join(",")), Ok(list));
    }

    #[test]
    fn a_glob_answers_quickly_whatever_its_stars(pattern in arb_pattern(), name in "[a-c]{0,40}") {
        let started = Instant::now();
        let _ = matches(&pattern, &name);
        prop_assert!(started.elapsed() < Duration::from_secs(1), "{pattern:?} vs {name:?}");
    }

    #[test]
    fn literal_escaped_and_wildcarded_forms_of_a_name_match_it(
        name in "\\PC{0,16}",
        holes in prop::collection::vec(any::<bool>(), 16),
    ) {
        let chars: Vec<char> = name.chars().collect();
        // The name itself, unless it has glob characters.
        if !name.contains(['\\', '*', '?', '[', ']']) {
            prop_assert!(matches(&name, &name));
        }
        // Every character escaped, or some replaced by `?`, or in a one-character class.
        let escaped: String = chars.iter().flat_map(|&c| ['\\', c]).collect();
        prop_assert!(glob(&escaped.chars().collect::<Vec<_>>(), &chars) == Some(true), "{escaped:?}");
        let wild: String = chars.iter().zip(&holes).map(|(&c, &h)| if h { "?".to_owned() } else { format!("\\{c}") }).collect();
        prop_assert!(matches(&format!("{wild}*"), &name) || chars.is_empty(), "{wild:?}");
        let classes: String = chars.iter().map(|&c| format!("[\\{c}]")).collect();
        prop_assert!(glob(&classes.chars().collect::<Vec<_>>(), &chars) == Some(true), "{classes:?}");
        prop_assert!(matches("*", &name));
    }

    #[test]
    fn lookups_with_any_file_and_module_never_panic(
        patterns in prop::collection::vec(arb_pattern(), 0..3),
        file in prop::option::of("\\PC{0,20}"),
        module in prop::option::of("[a-z:_é]{0,20}"),
    ) {
        let items: Vec<VModuleItem> = patterns.into_iter().map(|pattern| VModuleItem { pattern, level: 1 }).collect();
        let _ = level_for(&items, file.as_deref(), module.as_deref());
    }
}
