//! Property tests of the Go-style command line (issue 41, item 6): manifests written for Go's
//! flag package reach us as argv. Normalising and parsing any argv must never panic; the three
//! Go spellings of a flag with a value mean the same; durations printed the Go way parse back;
//! booleans, labels and feature gates answer junk with their error texts.

use proptest::prelude::*;

use super::*;
use crate::gofmt::format_go_duration;
use crate::provision::request::make_volume_name;

/// Flags that take a value, with values of their type (and junk).
fn arb_value_flag() -> impl Strategy<Value = (&'static str, String)> {
    prop_oneof![
        prop::sample::select(vec![
            "timeout",
            "retry-interval-start",
            "retry-interval-max",
            "audit-interval"
        ])
        .prop_flat_map(|f| ("[0-9]{1,3}(ms|s|m|h)|\\PC{0,6}", Just(f)).prop_map(|(v, f)| (f, v))),
        prop::sample::select(vec![
            "volume-name-prefix",
            "csi-address",
            "default-fstype",
            "kubeconfig"
        ])
        .prop_flat_map(
            |f| ("[a-z0-9/.-]{0,10}|-[a-z]{1,4}|\\PC{0,6}", Just(f)).prop_map(|(v, f)| (f, v))
        ),
        prop::sample::select(vec![
            "v",
            "volume-name-uuid-length",
            "kube-api-burst",
            "vmodule",
            "feature-gates",
            "leader-election-labels"
        ])
        .prop_flat_map(|f| ("-?[0-9]{1,3}|[a-z=:,]{0,8}", Just(f)).prop_map(|(v, f)| (f, v))),
    ]
}

/// Arbitrary argv pieces: flags of every spelling, bare words, `--`, junk.
fn arb_arg() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => ("-{1,3}", "[a-z-]{0,12}", prop::option::of("=[a-z0-9]{0,5}")).prop_map(|(d, n, v)| format!("{d}{n}{}", v.unwrap_or_default())),
        2 => prop::sample::select(vec![
            "--", "-", "-v5", "-v", "5", "-h", "--help", "-version", "--leader-election", "false",
            "--strict-topology=t", "-timeout", "10s", "--volume-name-prefix", "-x", "=", "-=",
        ]).prop_map(str::to_owned),
        1 => "\\PC{0,12}",
    ]
}

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    // Fewer cases: every parse builds clap's whole command.
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_argv_normalises_and_parses_without_panic(args in prop::collection::vec(arb_arg(), 0..6)) {
        let argv: Vec<String> = std::iter::once(PROGRAM.to_owned()).chain(args.iter().cloned()).collect();
        let out = normalize_args(argv.iter().map(OsString::from), |name| match name {
            "timeout" | "volume-name-prefix" | "v" => Some(FlagKind::Value),
            "leader-election" | "strict-topology" | "help" | "version" => Some(FlagKind::Switch),
            _ => None,
        });
        prop_assert_eq!(out.first().map(|a| a.to_str()), Some(Some(PROGRAM)));
        // What follows the first `--` in flag position is passed through untouched. As in Go, a
        // `--` right after a flag that takes a value is that value.
        let takes_next = |a: &str| {
            !a.starts_with("---")
                && matches!(a.strip_prefix("--").or_else(|| a.strip_prefix('-')), Some("timeout" | "volume-name-prefix" | "v"))
        };
        let mut at = 0;
        while at < args.len() && args[at] != "--" {
            at += if takes_next(&args[at]) { 2 } else { 1 };
        }
        if at < args.len() {
            let tail: Vec<OsString> = args[at..].iter().map(OsString::from).collect();
            prop_assert!(out.ends_with(&tail), "{out:?}");
        }
        let _ = Args::try_parse_go_style(&argv);
    }

    #[test]
    fn the_three_go_spellings_of_a_value_flag_agree(flags in prop::collection::vec(arb_value_flag(), 1..4)) {
        let spell = |style: u8| -> Vec<String> {
            std::iter::once(PROGRAM.to_owned())
                .chain(flags.iter().flat_map(|(f, v)| match style {
                    0 => vec![format!("--{f}={v}")],
                    1 => vec![format!("-{f}"), v.clone()],
                    _ => vec![format!("--{f}"), v.clone()],
                }))
                .collect()
        };
        let results: Vec<Result<Args, String>> =
            (0..3).map(|s| Args::try_parse_go_style(spell(s)).map_err(|e| e.kind().to_string())).collect();
        prop_assert_eq!(&results[0], &results[1], "{:?}", flags);
        prop_assert_eq!(&results[0], &results[2], "{:?}", flags);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_go_printed_duration_parses_back(nanos in prop_oneof![0u64..=i64::MAX as u64, 0u64..10_000_000_000, (0u64..100_000).prop_map(|s| s * 1_000_000_000)]) {
        let d = Duration::from_nanos(nanos);
        prop_assert_eq!(parse_go_duration(&format_go_duration(d)), Ok(d), "{}", format_go_duration(d));
    }

    #[test]
    fn any_duration_text_parses_or_says_why(text in prop_oneof!["[+-]?[0-9.]{0,25}(ns|us|µs|ms|s|m|h|d|)([0-9.]{0,4}(s|m|h|x))?", "\\PC{0,12}"]) {
        if let Err(err) = parse_go_duration(&text) {
            prop_assert!(err.starts_with(&format!("invalid duration {text:?}: ")), "{err}");
        }
    }

    #[test]
    fn booleans_labels_and_gates_answer_junk_with_their_texts(text in prop_oneof!["[a-zA-Z0-9=:, ]{0,16}", "\\PC{0,12}"]) {
        match parse_go_bool(&text) {
            Ok(b) => prop_assert!(["1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"].contains(&text.as_str()) && b == ["1", "t", "T", "TRUE", "true", "True"].contains(&text.as_str())),
            Err(err) => prop_assert!(err.starts_with(&format!("invalid boolean {text:?}")), "{err}"),
        }
        match parse_labels(&text) {
            Ok(list) => prop_assert_eq!(list.0.len(), text.split(',').count()),
            Err(err) => prop_assert!(err.starts_with("malformed item in list of labels: "), "{err}"),
        }
        if let Err(err) = parse_feature_gates(&text) {
            prop_assert!(
                err.starts_with("missing bool value for ") || err.starts_with("unrecognized feature gate: ")
                    || err.starts_with("invalid value of ") || err.starts_with("cannot set feature gate "),
                "{err}"
            );
        }
    }

    #[test]
    fn volume_names_are_the_prefix_and_the_uid(
        prefix in prop_oneof![Just(String::new()), "[a-z0-9-]{1,20}", "\\PC{0,10}"],
        uid in prop_oneof![Just(String::new()), "[a-f0-9-]{36}", "\\PC{0,40}"],
        length in prop::option::of(prop_oneof![0usize..40, any::<usize>()]),
    ) {
        match make_volume_name(&prefix, &uid, length) {
            Ok(name) => {
                let rest = name.strip_prefix(&format!("{prefix}-"));
                prop_assert!(rest.is_some(), "{name}");
                let rest = rest.unwrap_or_default();
                match length {
                    None => prop_assert_eq!(rest, uid.as_str()),
                    Some(n) => prop_assert!(rest.chars().count() <= n && uid.replace('-', "").starts_with(rest)),
                }
            }
            Err(err) if prefix.is_empty() => prop_assert_eq!(err.to_string(), "volume name prefix cannot be of length 0"),
            Err(err) => {
                prop_assert!(uid.is_empty());
                prop_assert_eq!(err.to_string(), "corrupted PVC object, it is missing UID");
            }
        }
    }
}
