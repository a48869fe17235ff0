//! Property tests of secret templates (issue 41, item 6): StorageClass parameters and claim
//! annotations are text users write. Expansion (`go_expand`) and resolution (`secret_reference`)
//! must never panic, must fail only with upstream's texts, and templates built from known tokens
//! must resolve to exactly their substitution.

use std::sync::LazyLock;

use proptest::prelude::*;
use regex::Regex;

use super::*;
use crate::names::*;

/// Kubernetes' own validation patterns (`IsDNS1123Label`, `IsDNS1123Subdomain`), as an oracle.
/// Compiled once: a debug-build compile per case would be most of the run time.
static LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").expect("label"));
static SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        .expect("subdomain")
});

/// Template-ish text: dollars, braces, token names and junk (unicode and control characters).
fn arb_template() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(vec![
                "${pv.name}", "${pvc.name}", "${pvc.namespace}", "${pvc.annotations['team']}",
                "${pvc.annotations['']}", "$", "${", "}", "${}", "$$", "${$}", "$1", "${foo}", "$pv",
                "-", ".", "_", "x", "a-b", "é", "\u{0}", "\n",
            ]).prop_map(str::to_owned),
            1 => "[a-z0-9.-]{0,8}",
            1 => "\\PC{0,6}",
            1 => any::<String>(),
        ],
        0..6,
    )
    .prop_map(|parts| parts.concat())
}

/// Parameters that mix every secret key (prefixed, deprecated and default) with template values.
fn arb_params() -> impl Strategy<Value = BTreeMap<String, String>> {
    let keys: Vec<&'static str> = SecretKind::ALL
        .iter()
        .flat_map(|k| {
            let (name, namespace) = k.keys_in_params();
            let old = k.deprecated_keys_in_params();
            [
                Some(name),
                Some(namespace),
                old.map(|o| o.0),
                old.map(|o| o.1),
            ]
        })
        .flatten()
        .chain([PARAM_SECRET_NAME, PARAM_SECRET_NAMESPACE, "other"])
        .collect();
    prop::collection::btree_map(
        prop::sample::select(keys).prop_map(str::to_owned),
        prop_oneof![3 => arb_template(), 1 => "[a-z0-9-]{1,10}"],
        0..6,
    )
}

/// Upstream's secret reference errors, as one pattern.
static UPSTREAM_ERRORS: LazyLock<Regex> = LazyLock::new(|| {
    let kinds = "(Provisioner|ControllerPublish|NodeStage|NodePublish|ControllerExpand|NodeExpand|ControllerModify|Default)";
    let keys = format!(
        "^failed to get (default )?name and namespace template from params: {kinds} secrets specified in parameters (with both \"csi\" and \"csi.storage.k8s.io/\" keys|but value of either namespace or name is empty)$|^failed to get (default )?name and namespace template from params: either name and namespace for {kinds} secrets specified, Both must be specified$"
    );
    let quoted = r#""([^"\\]|\\.)*""#;
    let tokens =
        format!("^error resolving value {quoted}: invalid tokens: \\[{quoted}( {quoted})*\\]$");
    let invalid =
        format!("^{quoted}( resolved to {quoted} which)? is not a valid (namespace|secret) name$");
    Regex::new(&format!("({keys})|({tokens})|({invalid})")).expect("pattern")
});

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn expansion_of_any_text_never_panics_and_leaves_dollar_free_text_alone(s in arb_template()) {
        let mut names = Vec::new();
        let out = go_expand(&s, |name| {
            names.push(name.to_owned());
            format!("<{name}>")
        });
        if !s.contains('$') {
            prop_assert_eq!(&out, &s);
            prop_assert!(names.is_empty());
        }
        // Every name handed to the mapping is a piece of the template.
        for name in &names {
            prop_assert!(!name.is_empty() && s.contains(name.as_str()), "{name:?} from {s:?}");
        }
    }

    #[test]
    fn literal_chunks_and_braced_tokens_expand_to_their_substitution(
        parts in prop::collection::vec(("[^$]{0,6}", "[^}]{1,10}"), 0..5),
        tail in "[^$]{0,6}",
    ) {
        let template: String =
            parts.iter().map(|(lit, name)| format!("{lit}${{{name}}}")).chain([tail.clone()]).collect();
        let want: String =
            parts.iter().map(|(lit, name)| format!("{lit}[{name}]")).chain([tail]).collect();
        // `${x}` with one special character x is Go's one-character form; it maps to x too.
        prop_assert_eq!(go_expand(&template, |name| format!("[{name}]")), want, "{}", template);
    }

    #[test]
    fn dns_checks_agree_with_kubernetes_patterns(s in prop_oneof![
        "[a-z0-9.-]{0,70}", "[a-zA-Z0-9._-]{0,10}", "\\PC{0,10}", "[a-z]{60,70}", "([a-z]{1,60}\\.){3,6}[a-z]{1,5}",
    ]) {
        prop_assert_eq!(is_dns1123_label(&s), s.len() <= 63 && LABEL.is_match(&s), "{:?}", s);
        prop_assert_eq!(is_dns1123_subdomain(&s), s.len() <= 253 && SUBDOMAIN.is_match(&s), "{:?}", s);
    }

    #[test]
    fn any_class_parameters_resolve_or_fail_with_upstreams_text(
        params in arb_params(),
        pv_name in prop_oneof!["pvc-[a-f0-9-]{1,36}", "\\PC{0,10}"],
        claim in prop::option::of(("[a-z0-9-]{0,10}", "\\PC{0,10}", prop::collection::btree_map("[a-z]{0,5}", "\\PC{0,8}", 0..3))),
    ) {
        let ctx = TemplateContext {
            pv_name: &pv_name,
            claim: claim.as_ref().map(|(name, namespace, ann)| ClaimIdentity { name, namespace, annotations: Some(ann) }),
        };
        for kind in SecretKind::ALL {
            match secret_reference(kind, &params, &ctx) {
                Ok(Some(found)) => {
                    prop_assert!(is_dns1123_label(&found.namespace), "{found:?}");
                    prop_assert!(is_dns1123_subdomain(&found.name), "{found:?}");
                }
                Ok(None) => {}
                Err(err) => {
                    let text = err.to_string();
                    prop_assert!(UPSTREAM_ERRORS.is_match(&text), "{kind:?}: {text}");
                }
            }
        }
    }

    #[test]
    fn templates_of_known_tokens_resolve_to_their_substitution(
        pv_suffix in "[a-f0-9]{1,8}",
        claim_name in "[a-z0-9]{1,8}",
        claim_namespace in "[a-z0-9]{1,8}",
        team in "[a-z0-9]{1,8}",
        name_parts in prop::collection::vec(0usize..5, 1..5),
        namespace_parts in prop::collection::vec(0usize..3, 1..4),
    ) {
        let pv_name = format!("pvc-{pv_suffix}");
        let ann = BTreeMap::from([("team".to_owned(), team.clone())]);
        let ctx = TemplateContext {
            pv_name: &pv_name,
            claim: Some(ClaimIdentity { name: &claim_name, namespace: &claim_namespace, annotations: Some(&ann) }),
        };
        // Each token with its value; literal `x` between them keeps the result a valid name.
        let tokens = [
            ("${pv.name}", pv_name.as_str()),
            ("${pvc.namespace}", claim_namespace.as_str()),
            ("$pvc", ""),
            ("${pvc.name}", claim_name.as_str()),
            ("${pvc.annotations['team']}", team.as_str()),
        ];
        let build = |parts: &[usize]| -> (String, String) {
            parts.iter().map(|&i| tokens[i]).fold((String::from("x"), String::from("x")), |(t, v), (tok, val)| {
                (format!("{t}{tok}x"), format!("{v}{val}x"))
            })
        };
        // `$pvc` is an unknown token: keep it out of the valid cases.
        let name_parts: Vec<usize> = name_parts.into_iter().filter(|&i| i != 2).collect();
        let namespace_parts: Vec<usize> = namespace_parts.into_iter().filter(|&i| i != 2).collect();
        let (name_template, name) = build(&name_parts);
        let (namespace_template, namespace) = build(&namespace_parts);
        let params = BTreeMap::from([
            (PARAM_NODE_STAGE_SECRET_NAME.to_owned(), name_template),
            (PARAM_NODE_STAGE_SECRET_NAMESPACE.to_owned(), namespace_template),
        ]);
        let got = secret_reference(SecretKind::NodeStage, &params, &ctx);
        prop_assert_eq!(got, Ok(Some(SecretRef { name, namespace })));
    }
}
