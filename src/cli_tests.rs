//! Unit tests of `cli.rs`: argv normalisation, Go booleans and durations, gates, labels.
use super::*;
use crate::gofmt::format_go_duration;

fn parse(args: &[&str]) -> Result<Args, clap::Error> {
    Args::try_parse_go_style(std::iter::once(PROGRAM).chain(args.iter().copied()))
}

fn normalized(args: &[&str]) -> Vec<String> {
    let kind_of = |name: &str| match name {
        "timeout" | "csi-address" | "v" | "volume-name-uuid-length" => Some(FlagKind::Value),
        "leader-election" | "help" => Some(FlagKind::Switch),
        _ => None,
    };
    normalize_args(
        std::iter::once("prog")
            .chain(args.iter().copied())
            .map(OsString::from),
        kind_of,
    )
    .into_iter()
    .skip(1)
    .map(|arg| arg.into_string().unwrap())
    .collect()
}

const S: fn(u64) -> Duration = Duration::from_secs;

#[test]
fn every_dash_style_normalises_to_double_dash_with_equals() {
    for argv in [
        &["--timeout=1s"][..],
        &["--timeout", "1s"],
        &["-timeout=1s"],
        &["-timeout", "1s"],
    ] {
        assert_eq!(normalized(argv), ["--timeout=1s"], "{argv:?}");
    }
}

#[test]
fn verbosity_shorthands_normalise_to_long_v() {
    for argv in [
        &["-v=5"][..],
        &["-v", "5"],
        &["--v=5"],
        &["--v", "5"],
        &["-v5"],
    ] {
        assert_eq!(normalized(argv), ["--v=5"], "{argv:?}");
    }
}

#[test]
fn a_bare_boolean_never_swallows_the_next_argument() {
    assert_eq!(
        normalized(&["-leader-election", "false"]),
        ["--leader-election", "false"]
    );
    assert_eq!(
        normalized(&["--leader-election", "-v=2"]),
        ["--leader-election", "--v=2"]
    );
}

#[test]
fn a_value_flag_takes_the_next_argument_even_when_it_starts_with_a_dash() {
    assert_eq!(
        normalized(&["-volume-name-uuid-length", "-1"]),
        ["--volume-name-uuid-length=-1"]
    );
}

#[test]
fn unknown_single_dash_flags_become_double_dash_so_errors_name_them() {
    assert_eq!(normalized(&["-no-such-flag=1"]), ["--no-such-flag=1"]);
    assert_eq!(normalized(&["-h"]), ["-h"]);
}

#[test]
fn arguments_after_a_double_dash_and_positionals_are_untouched() {
    assert_eq!(
        normalized(&["x", "--", "-timeout", "1s"]),
        ["x", "--", "-timeout", "1s"]
    );
    assert_eq!(normalized(&["-"]), ["-"]);
}

#[test]
fn a_value_flag_at_the_end_is_left_for_clap_to_report() {
    assert_eq!(normalized(&["-timeout"]), ["--timeout"]);
    let err = parse(&["-timeout"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn go_single_dash_command_lines_parse() {
    let args = parse(&[
        "-v=5",
        "-csi-address=/x",
        "-timeout",
        "1s",
        "-leader-election",
        "-feature-gates=Topology=false",
        "-kube-api-qps",
        "20",
    ])
    .unwrap();
    assert_eq!(args.v, 5);
    assert_eq!(args.csi_address, "/x");
    assert_eq!(args.timeout, S(1));
    assert!(args.leader_election);
    assert_eq!(
        args.feature_gate_settings().collect::<Vec<_>>(),
        [(FeatureGate::Topology, false)]
    );
    assert_eq!(args.kube_api_qps, 20.0);
}

#[test]
fn booleans_accept_every_go_spelling() {
    for (text, expected) in [
        ("1", true),
        ("t", true),
        ("T", true),
        ("TRUE", true),
        ("true", true),
        ("True", true),
        ("0", false),
        ("f", false),
        ("F", false),
        ("FALSE", false),
        ("false", false),
        ("False", false),
    ] {
        let args = parse(&[
            &format!("--strict-topology={text}"),
            &format!("-immediate-topology={text}"),
        ])
        .unwrap();
        assert_eq!(
            (args.strict_topology, args.immediate_topology),
            (expected, expected),
            "{text}"
        );
    }
    assert!(parse(&["--strict-topology"]).unwrap().strict_topology);
    let err = parse(&["--strict-topology=yes"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("strict-topology"), "{err}");
}

#[test]
fn a_stray_value_after_a_boolean_is_an_error_not_silently_ignored() {
    let err = parse(&["--leader-election", "false"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("'false'"), "{err}");
}

#[test]
fn a_repeated_flag_keeps_its_last_value_as_in_go() {
    assert_eq!(
        parse(&["--timeout=1s", "-timeout=2s"]).unwrap().timeout,
        S(2)
    );
    let merged = parse(&[
        "--leader-election-labels=a:1,b:2",
        "--leader-election-labels=b:3",
    ])
    .unwrap();
    assert_eq!(
        merged.leader_election_label_map(),
        BTreeMap::from([("a".into(), "1".into()), ("b".into(), "3".into())])
    );
}

#[test]
fn unknown_flags_are_usage_errors_that_name_the_flag() {
    for argv in [
        &["--no-such-flag"][..],
        &["-no-such-flag=3"],
        &["--no-such-flag", "3"],
    ] {
        let err = parse(argv).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{argv:?}");
        assert!(err.to_string().contains("no-such-flag"), "{err}");
    }
}

#[test]
fn go_durations_parse() {
    let ms = Duration::from_millis;
    for (text, expected) in [
        ("0", Duration::ZERO),
        ("15s", S(15)),
        ("5m", S(300)),
        ("1m30s", S(90)),
        ("1.5h", S(5400)),
        ("300ms", ms(300)),
        (".5s", ms(500)),
        ("1.s", S(1)),
        ("2h45m", S(9900)),
        ("1us", Duration::from_micros(1)),
        ("1µs", Duration::from_micros(1)),
        ("1μs", Duration::from_micros(1)),
        ("7ns", Duration::from_nanos(7)),
        ("+10s", S(10)),
        ("-0", Duration::ZERO),
        ("0s", Duration::ZERO),
        ("1.000000001s", Duration::new(1, 1)),
    ] {
        assert_eq!(parse_go_duration(text), Ok(expected), "{text}");
    }
}

#[test]
fn malformed_durations_are_rejected_with_the_reason() {
    for (text, reason) in [
        ("", "empty"),
        ("10", "missing unit"),
        ("1d", "unknown unit \"d\""),
        ("s", "expected a number"),
        (".s", "expected a number"),
        ("-5s", "negative"),
        ("1s2", "missing unit"),
        ("3000000h", "out of range"),
    ] {
        let err = parse_go_duration(text).unwrap_err();
        assert!(
            err.contains(reason) && err.contains(&format!("{text:?}")),
            "{text}: {err}"
        );
    }
}

#[test]
fn durations_format_like_go() {
    for (duration, text) in [
        (Duration::ZERO, "0s"),
        (S(1), "1s"),
        (S(300), "5m0s"),
        (S(90), "1m30s"),
        (S(5400), "1h30m0s"),
        (Duration::from_millis(1500), "1.5s"),
        (Duration::from_millis(300), "300ms"),
        (Duration::from_micros(2), "2µs"),
        (Duration::from_nanos(5), "5ns"),
    ] {
        assert_eq!(format_go_duration(duration), text);
        assert_eq!(parse_go_duration(text), Ok(duration));
    }
}

#[test]
fn feature_gates_parse_like_component_base() {
    let gates =
        parse_feature_gates(" Topology=false, VolumeAttributesClass=t ,AllAlpha=true,").unwrap();
    assert_eq!(
        gates.0,
        [
            (FeatureGate::Topology, false),
            (FeatureGate::VolumeAttributesClass, true),
            (FeatureGate::AllAlpha, true)
        ]
    );
    assert_eq!(parse_feature_gates("").unwrap().0, []);
    assert_eq!(
        parse_feature_gates("HonorPVReclaimPolicy=true").unwrap().0,
        [(FeatureGate::HonorPvReclaimPolicy, true)]
    );
}

#[test]
fn bad_feature_gates_are_usage_errors() {
    for (text, reason) in [
        ("NoSuchGate=true", "unrecognized feature gate: NoSuchGate"),
        ("Topology", "missing bool value for Topology"),
        ("Topology=maybe", "invalid value of Topology=maybe"),
        ("HonorPVReclaimPolicy=false", "locked to true"),
        // An API server gate locked as upstream's: refused as upstream refuses it.
        (
            "BtreeWatchCache=false",
            "cannot set feature gate BtreeWatchCache to false, feature is locked to true",
        ),
        ("LoggingAlphaOptions=true", "unrecognized feature gate"),
    ] {
        let err = parse_feature_gates(text).unwrap_err();
        assert!(err.contains(reason), "{text}: {err}");
        let err = parse(&[&format!("--feature-gates={text}")]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains(reason), "{err}");
    }
}

#[test]
fn leader_election_labels_parse_like_csi_lib_utils() {
    assert_eq!(
        parse_labels("a:1,b:").unwrap().0,
        [
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), String::new())
        ]
    );
    for text in ["a", "a:1:2", "a:1,,b:2", "", ":v"] {
        let err = parse_labels(text).unwrap_err();
        assert!(
            err.contains("malformed item in list of labels"),
            "{text}: {err}"
        );
    }
    assert_eq!(
        parse(&["--leader-election-labels=nope"])
            .unwrap_err()
            .exit_code(),
        2
    );
}

#[test]
fn version_is_a_go_boolean() {
    assert!(parse(&["--version"]).unwrap().version);
    assert!(parse(&["-version"]).unwrap().version);
    assert!(!parse(&["--version=false"]).unwrap().version);
}

#[test]
fn help_is_not_an_error_and_exits_zero() {
    for flag in ["--help", "-help", "-h"] {
        let err = parse(&[flag]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp, "{flag}");
        assert_eq!(err.exit_code(), 0);
    }
}

#[test]
fn logging_format_accepts_text_and_json_only() {
    assert_eq!(
        parse(&["--logging-format=json"]).unwrap().logging_format,
        LogFormat::Json
    );
    let err = parse(&["-logging-format", "xml"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("xml"), "{err}");
}

#[test]
fn every_flag_is_listed_under_the_section_it_is_declared_in() {
    let command = Args::command();
    let heading = |id: &str| {
        let arg = command.get_arguments().find(|arg| arg.get_id() == id);
        arg.unwrap_or_else(|| panic!("no flag {id}"))
            .get_help_heading()
    };
    assert_eq!(heading("version"), None);
    for (id, section) in [
        ("csi_address", "CSI driver"),
        ("timeout", "CSI driver"),
        ("volume_name_prefix", "Provisioning"),
        ("feature_gates", "Provisioning"),
        ("node_deployment_intent_journal", "Node deployment"),
        ("deleted_node_pvc_cleanup", "Deleted nodes"),
        ("track_unused_claims", "Operator aids"),
        ("kube_api_burst", "Kubernetes API"),
        ("enable_pprof", "HTTP"),
        ("leader_election_labels", "Leader election"),
        ("kube_api_capacity_burst", "Storage capacity"),
        ("v", "Logging"),
        ("automaxprocs", "Logging"),
    ] {
        assert_eq!(heading(id), Some(section), "--{id}");
    }
}
