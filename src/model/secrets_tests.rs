//! Tests of `secrets`: upstream `TestGetSecretReference` case by case, error texts, templates.

use super::*;
use crate::names::*;

fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

type Pairs = &'static [(&'static str, &'static str)];
/// (name, namespace, annotations) of the claim templates see.
type Claim = (&'static str, &'static str, Pairs);

struct Case {
    name: &'static str,
    kind: SecretKind,
    params: Pairs,
    pv_name: &'static str,
    claim: Option<Claim>,
    expect: Result<Option<(&'static str, &'static str)>, ()>,
}

const NO_ANN: &[(&str, &str)] = &[];

/// Upstream `TestGetSecretReference`, case by case (names kept).
#[test]
fn secret_references_resolve_as_upstream_get_secret_reference() {
    use SecretKind::*;
    let cases = [
        Case {
            name: "no params",
            kind: NodePublish,
            params: &[],
            pv_name: "",
            claim: None,
            expect: Ok(None),
        },
        Case {
            name: "empty err",
            kind: NodePublish,
            params: &[
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, ""),
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE, ""),
            ],
            pv_name: "",
            claim: None,
            expect: Err(()),
        },
        Case {
            name: "[deprecated] name, no namespace",
            kind: NodePublish,
            params: &[(PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, "foo")],
            pv_name: "",
            claim: None,
            expect: Err(()),
        },
        Case {
            name: "name, no namespace",
            kind: NodePublish,
            params: &[(PARAM_NODE_PUBLISH_SECRET_NAME, "foo")],
            pv_name: "",
            claim: None,
            expect: Err(()),
        },
        Case {
            name: "[deprecated] namespace, no name",
            kind: NodePublish,
            params: &[(PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE, "foo")],
            pv_name: "",
            claim: None,
            expect: Err(()),
        },
        Case {
            name: "namespace, no name",
            kind: NodePublish,
            params: &[(PARAM_NODE_PUBLISH_SECRET_NAMESPACE, "foo")],
            pv_name: "",
            claim: None,
            expect: Err(()),
        },
        Case {
            name: "[deprecated] simple - valid",
            kind: NodePublish,
            params: &[
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, "name"),
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE, "ns"),
            ],
            pv_name: "",
            claim: Some(("", "", NO_ANN)),
            expect: Ok(Some(("name", "ns"))),
        },
        Case {
            name: "deprecated and new both",
            kind: NodePublish,
            params: &[
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, "name"),
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE, "ns"),
                (PARAM_NODE_PUBLISH_SECRET_NAME, "name"),
                (PARAM_NODE_PUBLISH_SECRET_NAMESPACE, "ns"),
            ],
            pv_name: "",
            claim: None,
            expect: Err(()),
        },
        Case {
            name: "deprecated and new names",
            kind: NodePublish,
            params: &[
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, "name"),
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE, "ns"),
                (PARAM_NODE_PUBLISH_SECRET_NAME, "name"),
            ],
            pv_name: "",
            claim: None,
            expect: Err(()),
        },
        Case {
            name: "deprecated and new namespace",
            kind: NodePublish,
            params: &[
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, "name"),
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE, "ns"),
                (PARAM_NODE_PUBLISH_SECRET_NAMESPACE, "ns"),
            ],
            pv_name: "",
            claim: None,
            expect: Err(()),
        },
        Case {
            name: "deprecated and new mixed",
            kind: NodePublish,
            params: &[
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, "name"),
                (PARAM_NODE_PUBLISH_SECRET_NAMESPACE, "ns"),
            ],
            pv_name: "",
            claim: Some(("", "", NO_ANN)),
            expect: Ok(Some(("name", "ns"))),
        },
        Case {
            name: "simple - valid",
            kind: NodePublish,
            params: &[
                (PARAM_NODE_PUBLISH_SECRET_NAME, "name"),
                (PARAM_NODE_PUBLISH_SECRET_NAMESPACE, "ns"),
            ],
            pv_name: "",
            claim: Some(("", "", NO_ANN)),
            expect: Ok(Some(("name", "ns"))),
        },
        Case {
            name: "simple - valid, no pvc",
            kind: Provisioner,
            params: &[
                (PARAM_DEPRECATED_PROVISIONER_SECRET_NAME, "name"),
                (PARAM_DEPRECATED_PROVISIONER_SECRET_NAMESPACE, "ns"),
            ],
            pv_name: "",
            claim: None,
            expect: Ok(Some(("name", "ns"))),
        },
        Case {
            name: "simple - valid, pvc name and namespace",
            kind: Provisioner,
            params: &[
                (PARAM_DEPRECATED_PROVISIONER_SECRET_NAME, "param-name"),
                (PARAM_DEPRECATED_PROVISIONER_SECRET_NAMESPACE, "param-ns"),
            ],
            pv_name: "",
            claim: Some(("name", "ns", NO_ANN)),
            expect: Ok(Some(("param-name", "param-ns"))),
        },
        Case {
            name: "simple - invalid name",
            kind: NodePublish,
            params: &[
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, "bad name"),
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE, "ns"),
            ],
            pv_name: "",
            claim: Some(("", "", NO_ANN)),
            expect: Err(()),
        },
        Case {
            name: "simple - invalid namespace",
            kind: NodePublish,
            params: &[
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, "name"),
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE, "bad ns"),
            ],
            pv_name: "",
            claim: Some(("", "", NO_ANN)),
            expect: Err(()),
        },
        Case {
            name: "template - PVC name annotations not supported for Provision and Delete",
            kind: Provisioner,
            params: &[(
                PARAM_PROVISIONER_SECRET_NAME,
                "static-${pv.name}-${pvc.namespace}-${pvc.name}-${pvc.annotations['akey']}",
            )],
            pv_name: "",
            claim: Some(("name", "ns", NO_ANN)),
            expect: Err(()),
        },
        Case {
            name: "template - valid PVC annotations for Provision and Delete",
            kind: Provisioner,
            params: &[
                (
                    PARAM_PROVISIONER_SECRET_NAMESPACE,
                    "static-${pvc.namespace}",
                ),
                (
                    PARAM_PROVISIONER_SECRET_NAME,
                    "static-${pvc.name}-${pvc.annotations['akey']}",
                ),
            ],
            pv_name: "pvname",
            claim: Some(("name", "pvcnamespace", &[("akey", "avalue")])),
            expect: Ok(Some(("static-name-avalue", "static-pvcnamespace"))),
        },
        Case {
            name: "template - valid nodepublish secret ref",
            kind: NodePublish,
            params: &[
                (
                    PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME,
                    "static-${pv.name}-${pvc.namespace}-${pvc.name}-${pvc.annotations['akey']}",
                ),
                (
                    PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE,
                    "static-${pv.name}-${pvc.namespace}",
                ),
            ],
            pv_name: "pvname",
            claim: Some(("pvcname", "pvcnamespace", &[("akey", "avalue")])),
            expect: Ok(Some((
                "static-pvname-pvcnamespace-pvcname-avalue",
                "static-pvname-pvcnamespace",
            ))),
        },
        Case {
            name: "template - valid provisioner secret ref",
            kind: Provisioner,
            params: &[
                (
                    PARAM_DEPRECATED_PROVISIONER_SECRET_NAME,
                    "static-provisioner-${pv.name}-${pvc.namespace}-${pvc.name}",
                ),
                (
                    PARAM_DEPRECATED_PROVISIONER_SECRET_NAMESPACE,
                    "static-provisioner-${pv.name}-${pvc.namespace}",
                ),
            ],
            pv_name: "pvname",
            claim: Some(("pvcname", "pvcnamespace", NO_ANN)),
            expect: Ok(Some((
                "static-provisioner-pvname-pvcnamespace-pvcname",
                "static-provisioner-pvname-pvcnamespace",
            ))),
        },
        Case {
            name: "template - valid, with pvc.name",
            kind: Provisioner,
            params: &[
                (PARAM_DEPRECATED_PROVISIONER_SECRET_NAME, "${pvc.name}"),
                (PARAM_DEPRECATED_PROVISIONER_SECRET_NAMESPACE, "ns"),
            ],
            pv_name: "",
            claim: Some(("pvcname", "pvcns", NO_ANN)),
            expect: Ok(Some(("pvcname", "ns"))),
        },
        Case {
            name: "template - valid, provisioner with pvc name and namespace",
            kind: Provisioner,
            params: &[
                (PARAM_DEPRECATED_PROVISIONER_SECRET_NAME, "${pvc.name}"),
                (
                    PARAM_DEPRECATED_PROVISIONER_SECRET_NAMESPACE,
                    "${pvc.namespace}",
                ),
            ],
            pv_name: "",
            claim: Some(("pvcname", "pvcns", NO_ANN)),
            expect: Ok(Some(("pvcname", "pvcns"))),
        },
        Case {
            name: "template - valid, static pvc name and templated namespace",
            kind: Provisioner,
            params: &[
                (PARAM_DEPRECATED_PROVISIONER_SECRET_NAME, "static-name-1"),
                (
                    PARAM_DEPRECATED_PROVISIONER_SECRET_NAMESPACE,
                    "${pvc.namespace}",
                ),
            ],
            pv_name: "",
            claim: Some(("name", "ns", NO_ANN)),
            expect: Ok(Some(("static-name-1", "ns"))),
        },
        Case {
            name: "template - invalid namespace tokens",
            kind: NodePublish,
            params: &[
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, "myname"),
                (
                    PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE,
                    "mynamespace${bar}",
                ),
            ],
            pv_name: "",
            claim: Some(("", "", NO_ANN)),
            expect: Err(()),
        },
        Case {
            name: "template - invalid name tokens",
            kind: NodePublish,
            params: &[
                (PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME, "myname${foo}"),
                (
                    PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE,
                    "mynamespace",
                ),
            ],
            pv_name: "",
            claim: Some(("", "", NO_ANN)),
            expect: Err(()),
        },
    ];
    for case in cases {
        let annotations;
        let claim = match case.claim {
            Some((name, namespace, ann)) => {
                annotations = params(ann);
                Some(ClaimIdentity {
                    name,
                    namespace,
                    annotations: Some(&annotations),
                })
            }
            None => None,
        };
        let ctx = TemplateContext {
            pv_name: case.pv_name,
            claim,
        };
        let got = secret_reference(case.kind, &params(case.params), &ctx);
        let got = got
            .map(|r| r.map(|r| (r.name, r.namespace)))
            .map_err(|_| ());
        let want = case
            .expect
            .map(|r| r.map(|(n, ns)| (n.to_owned(), ns.to_owned())));
        assert_eq!(got, want, "case {:?}", case.name);
    }
}

fn node_publish(name: &str, namespace: &str) -> BTreeMap<String, String> {
    params(&[
        (PARAM_NODE_PUBLISH_SECRET_NAME, name),
        (PARAM_NODE_PUBLISH_SECRET_NAMESPACE, namespace),
    ])
}

fn err_text(p: &BTreeMap<String, String>, kind: SecretKind) -> String {
    let ann = BTreeMap::new();
    let ctx = TemplateContext {
        pv_name: "pv-1",
        claim: Some(ClaimIdentity {
            name: "c",
            namespace: "ns",
            annotations: Some(&ann),
        }),
    };
    secret_reference(kind, p, &ctx).unwrap_err().to_string()
}

#[test]
fn error_texts_are_upstreams() {
    assert_eq!(
        err_text(&node_publish("x", ""), SecretKind::NodePublish),
        "failed to get name and namespace template from params: NodePublish secrets specified in parameters but value of either namespace or name is empty"
    );
    assert_eq!(
        err_text(
            &params(&[(PARAM_PROVISIONER_SECRET_NAME, "x")]),
            SecretKind::Provisioner
        ),
        "failed to get name and namespace template from params: either name and namespace for Provisioner secrets specified, Both must be specified"
    );
    assert_eq!(
        err_text(
            &params(&[
                (PARAM_DEPRECATED_NODE_STAGE_SECRET_NAME, "x"),
                (PARAM_NODE_STAGE_SECRET_NAME, "x"),
                (PARAM_NODE_STAGE_SECRET_NAMESPACE, "x"),
            ]),
            SecretKind::NodeStage
        ),
        "failed to get name and namespace template from params: NodeStage secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys"
    );
    assert_eq!(
        err_text(
            &params(&[(PARAM_SECRET_NAME, "x")]),
            SecretKind::ControllerExpand
        ),
        "failed to get default name and namespace template from params: either name and namespace for Default secrets specified, Both must be specified"
    );
    assert_eq!(
        err_text(
            &node_publish("${pvc.annotations['a']}-${foo}", "ns"),
            SecretKind::NodePublish
        ),
        r#"error resolving value "${pvc.annotations['a']}-${foo}": invalid tokens: ["foo" "pvc.annotations['a']"]"#
    );
    assert_eq!(
        err_text(&node_publish("s", "${pvc.name}"), SecretKind::NodePublish),
        r#"error resolving value "${pvc.name}": invalid tokens: ["pvc.name"]"#
    );
    assert_eq!(
        err_text(&node_publish("s", "Bad"), SecretKind::NodePublish),
        r#""Bad" is not a valid namespace name"#
    );
    assert_eq!(
        err_text(
            &node_publish("${pvc.name}_x", "ns"),
            SecretKind::NodePublish
        ),
        r#""${pvc.name}_x" resolved to "c_x" which is not a valid secret name"#
    );
}

#[test]
fn default_pair_applies_to_every_type_without_its_own() {
    let p = params(&[
        (PARAM_SECRET_NAME, "default-${pvc.name}"),
        (PARAM_SECRET_NAMESPACE, "${pvc.namespace}"),
        (PARAM_NODE_STAGE_SECRET_NAME, "stage"),
        (PARAM_NODE_STAGE_SECRET_NAMESPACE, "kube-system"),
    ]);
    let ann = BTreeMap::new();
    let ctx = TemplateContext {
        pv_name: "pv-1",
        claim: Some(ClaimIdentity {
            name: "data",
            namespace: "apps",
            annotations: Some(&ann),
        }),
    };
    let refs = resolve_all(&p, &ctx).unwrap();
    let default = Some(SecretRef::new("default-data", "apps"));
    assert_eq!(refs.provisioner, default);
    assert_eq!(refs.controller_publish, default);
    assert_eq!(
        refs.node_stage,
        Some(SecretRef::new("stage", "kube-system"))
    );
    assert_eq!(refs.node_publish, default);
    assert_eq!(refs.controller_expand, default);
    assert_eq!(refs.node_expand, default);
    assert_eq!(refs.controller_modify, default);
}

#[test]
fn deletion_cannot_use_claim_annotations() {
    let p = params(&[
        (PARAM_PROVISIONER_SECRET_NAME, "${pvc.annotations['team']}"),
        (PARAM_PROVISIONER_SECRET_NAMESPACE, "${pvc.namespace}"),
    ]);
    let err = resolve_provisioner_secret_for_delete(&p, "pv-1", "c", "ns").unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"error resolving value "${pvc.annotations['team']}": invalid tokens: ["pvc.annotations['team']"]"#
    );
    let p = params(&[
        (PARAM_PROVISIONER_SECRET_NAME, "${pv.name}-${pvc.name}"),
        (PARAM_PROVISIONER_SECRET_NAMESPACE, "${pvc.namespace}"),
    ]);
    assert_eq!(
        resolve_provisioner_secret_for_delete(&p, "pv-1", "c", "ns").unwrap(),
        Some(SecretRef::new("pv-1-c", "ns"))
    );
    assert_eq!(
        resolve_provisioner_secret_for_delete(&BTreeMap::new(), "pv-1", "c", "ns").unwrap(),
        None
    );
}

#[test]
fn go_expand_matches_os_expand() {
    let map = |k: &str| format!("<{k}>");
    assert_eq!(go_expand("plain", map), "plain");
    assert_eq!(go_expand("${pv.name}-x", map), "<pv.name>-x");
    assert_eq!(go_expand("$name.x", map), "<name>.x");
    assert_eq!(go_expand("a$1b", map), "a<1>b");
    assert_eq!(go_expand("${1}", map), "<1>");
    assert_eq!(go_expand("cost$", map), "cost$");
    assert_eq!(go_expand("a$.b", map), "a$.b");
    assert_eq!(go_expand("a${}b", map), "ab");
    assert_eq!(go_expand("a${b", map), "ab");
    assert_eq!(go_expand("$$", map), "<$>");
}

#[test]
fn dns1123_rules() {
    assert!(is_dns1123_label("kube-system"));
    assert!(!is_dns1123_label("Kube"));
    assert!(!is_dns1123_label("-a"));
    assert!(!is_dns1123_label("a.b"));
    assert!(!is_dns1123_label(""));
    assert!(!is_dns1123_label(&"a".repeat(64)));
    assert!(is_dns1123_subdomain("a.b-c.d"));
    assert!(!is_dns1123_subdomain("a..b"));
    assert!(!is_dns1123_subdomain("a_b"));
    assert!(!is_dns1123_subdomain(&"a".repeat(254)));
}
