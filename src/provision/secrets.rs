//! StorageClass secret references: which parameter keys name the secret of each CSI call, the
//! `${...}` templates in them, and the validation upstream applies (reference §3.5). Pure: the
//! secret itself is fetched by the shell.
//!
//! Each secret type has a name/namespace key pair (plus a deprecated unprefixed pair for the four
//! oldest types); a type with neither falls back to the default pair
//! `csi.storage.k8s.io/secret-name`/`-namespace`. Templates follow Go `os.Expand`, so both
//! `${pvc.name}` and `$name` are expansions. Tokens available:
//!
//! | token | namespace template | name template |
//! |---|---|---|
//! | `${pv.name}` | yes | yes |
//! | `${pvc.namespace}` | yes, when a claim is known | yes, when a claim is known |
//! | `${pvc.name}` | no | yes, when a claim is known |
//! | `${pvc.annotations['KEY']}` | no | yes, when the claim's annotations are known |
//!
//! The claim's annotations are known when provisioning, not when deleting a PV whose deletion
//! secret must be re-derived from the StorageClass ([`resolve_provisioner_secret_for_delete`]):
//! the claim may be gone, so only its name and namespace (from the PV's claimRef) are available.
//! Which tokens exist is therefore an input ([`TemplateContext`]), never guessed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::SecretReference;

use super::gofmt;
use crate::names;

/// The CSI calls a StorageClass can name a secret for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SecretKind {
    /// CreateVolume and DeleteVolume.
    Provisioner,
    /// ControllerPublishVolume / ControllerUnpublishVolume (stored on the PV).
    ControllerPublish,
    /// NodeStageVolume (stored on the PV).
    NodeStage,
    /// NodePublishVolume (stored on the PV).
    NodePublish,
    /// ControllerExpandVolume (stored on the PV).
    ControllerExpand,
    /// NodeExpandVolume (stored on the PV).
    NodeExpand,
    /// ControllerModifyVolume (stored as PV annotations, read by external-resizer).
    ControllerModify,
}

/// The key pairs one secret type is read from.
struct SecretKeys {
    /// Upstream's type name in error messages.
    label: &'static str,
    name: &'static str,
    namespace: &'static str,
    deprecated: Option<(&'static str, &'static str)>,
}

const DEFAULT_KEYS: SecretKeys = SecretKeys {
    label: "Default",
    name: names::PARAM_SECRET_NAME,
    namespace: names::PARAM_SECRET_NAMESPACE,
    deprecated: None,
};

impl SecretKind {
    /// Every type, in the order upstream resolves them.
    pub const ALL: [SecretKind; 7] = [
        SecretKind::Provisioner,
        SecretKind::ControllerPublish,
        SecretKind::NodeStage,
        SecretKind::NodePublish,
        SecretKind::ControllerExpand,
        SecretKind::NodeExpand,
        SecretKind::ControllerModify,
    ];

    /// Upstream's name for the type, as used in its error messages (`Provisioner`, `NodeStage`, ...).
    pub fn label(self) -> &'static str {
        self.keys().label
    }

    /// The `(name, namespace)` parameter keys of the type.
    pub fn keys_in_params(self) -> (&'static str, &'static str) {
        let keys = self.keys();
        (keys.name, keys.namespace)
    }

    /// The deprecated `(name, namespace)` keys, for the four types that have them.
    pub fn deprecated_keys_in_params(self) -> Option<(&'static str, &'static str)> {
        self.keys().deprecated
    }

    fn keys(self) -> SecretKeys {
        use names::*;
        match self {
            SecretKind::Provisioner => SecretKeys {
                label: "Provisioner",
                name: PARAM_PROVISIONER_SECRET_NAME,
                namespace: PARAM_PROVISIONER_SECRET_NAMESPACE,
                deprecated: Some((
                    PARAM_DEPRECATED_PROVISIONER_SECRET_NAME,
                    PARAM_DEPRECATED_PROVISIONER_SECRET_NAMESPACE,
                )),
            },
            SecretKind::ControllerPublish => SecretKeys {
                label: "ControllerPublish",
                name: PARAM_CONTROLLER_PUBLISH_SECRET_NAME,
                namespace: PARAM_CONTROLLER_PUBLISH_SECRET_NAMESPACE,
                deprecated: Some((
                    PARAM_DEPRECATED_CONTROLLER_PUBLISH_SECRET_NAME,
                    PARAM_DEPRECATED_CONTROLLER_PUBLISH_SECRET_NAMESPACE,
                )),
            },
            SecretKind::NodeStage => SecretKeys {
                label: "NodeStage",
                name: PARAM_NODE_STAGE_SECRET_NAME,
                namespace: PARAM_NODE_STAGE_SECRET_NAMESPACE,
                deprecated: Some((
                    PARAM_DEPRECATED_NODE_STAGE_SECRET_NAME,
                    PARAM_DEPRECATED_NODE_STAGE_SECRET_NAMESPACE,
                )),
            },
            SecretKind::NodePublish => SecretKeys {
                label: "NodePublish",
                name: PARAM_NODE_PUBLISH_SECRET_NAME,
                namespace: PARAM_NODE_PUBLISH_SECRET_NAMESPACE,
                deprecated: Some((
                    PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME,
                    PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE,
                )),
            },
            SecretKind::ControllerExpand => SecretKeys {
                label: "ControllerExpand",
                name: PARAM_CONTROLLER_EXPAND_SECRET_NAME,
                namespace: PARAM_CONTROLLER_EXPAND_SECRET_NAMESPACE,
                deprecated: None,
            },
            SecretKind::NodeExpand => SecretKeys {
                label: "NodeExpand",
                name: PARAM_NODE_EXPAND_SECRET_NAME,
                namespace: PARAM_NODE_EXPAND_SECRET_NAMESPACE,
                deprecated: None,
            },
            SecretKind::ControllerModify => SecretKeys {
                label: "ControllerModify",
                name: PARAM_CONTROLLER_MODIFY_SECRET_NAME,
                namespace: PARAM_CONTROLLER_MODIFY_SECRET_NAMESPACE,
                deprecated: None,
            },
        }
    }
}

/// A resolved secret reference (validated name and namespace).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretRef {
    /// Secret name (a DNS-1123 subdomain).
    pub name: String,
    /// Secret namespace (a DNS-1123 label).
    pub namespace: String,
}

impl SecretRef {
    /// Convenience constructor.
    pub fn new(name: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
        }
    }
}

impl From<&SecretRef> for SecretReference {
    fn from(r: &SecretRef) -> Self {
        SecretReference {
            name: Some(r.name.clone()),
            namespace: Some(r.namespace.clone()),
        }
    }
}

/// The claim as seen by templates.
#[derive(Debug, Clone, Copy)]
pub struct ClaimIdentity<'a> {
    /// `${pvc.name}`.
    pub name: &'a str,
    /// `${pvc.namespace}`.
    pub namespace: &'a str,
    /// `${pvc.annotations['KEY']}`; `None` when they are not known (deletion), which makes any
    /// annotation token invalid.
    pub annotations: Option<&'a BTreeMap<String, String>>,
}

/// What templates may refer to: the PV name always, the claim when one is known.
#[derive(Debug, Clone, Copy)]
pub struct TemplateContext<'a> {
    /// `${pv.name}`.
    pub pv_name: &'a str,
    /// The claim, if any.
    pub claim: Option<ClaimIdentity<'a>>,
}

/// Why the secret keys of a StorageClass are unusable (before any template is expanded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretKeyError {
    /// The prefixed and the deprecated key of the same field are both set.
    #[error(
        "{kind} secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys"
    )]
    BothKeyStyles {
        /// Upstream type label.
        kind: &'static str,
    },
    /// Only one of name and namespace is set.
    #[error("either name and namespace for {kind} secrets specified, Both must be specified")]
    HalfPair {
        /// Upstream type label.
        kind: &'static str,
    },
    /// Both keys are set but one value is empty.
    #[error(
        "{kind} secrets specified in parameters but value of either namespace or name is empty"
    )]
    EmptyValue {
        /// Upstream type label.
        kind: &'static str,
    },
}

/// A secret reference that cannot be resolved. `Display` is upstream's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The type's own keys are malformed.
    #[error("failed to get name and namespace template from params: {0}")]
    Keys(SecretKeyError),
    /// The default keys are malformed (the type had none of its own).
    #[error("failed to get default name and namespace template from params: {0}")]
    DefaultKeys(SecretKeyError),
    /// The template uses tokens that are not available where it is used.
    #[error("error resolving value {}: invalid tokens: {}", gofmt::quote(.template), gofmt::quote_list(.tokens))]
    InvalidTokens {
        /// The template as written in the StorageClass.
        template: String,
        /// Unknown tokens, sorted.
        tokens: Vec<String>,
    },
    /// The namespace is not a DNS-1123 label.
    #[error("{}", invalid_value(.template, .resolved, "namespace"))]
    InvalidNamespace {
        /// The template as written.
        template: String,
        /// What it expanded to.
        resolved: String,
    },
    /// The name is not a DNS-1123 subdomain.
    #[error("{}", invalid_value(.template, .resolved, "secret"))]
    InvalidName {
        /// The template as written.
        template: String,
        /// What it expanded to.
        resolved: String,
    },
}

fn invalid_value(template: &str, resolved: &str, what: &str) -> String {
    if template == resolved {
        format!("{} is not a valid {what} name", gofmt::quote(template))
    } else {
        format!(
            "{} resolved to {} which is not a valid {what} name",
            gofmt::quote(template),
            gofmt::quote(resolved)
        )
    }
}

/// The name and namespace templates of one key set, or `None` when none of its keys is set.
fn templates(
    keys: &SecretKeys,
    params: &BTreeMap<String, String>,
) -> Result<Option<(String, String)>, SecretKeyError> {
    let mut name = None;
    let mut namespace = None;
    let mut names_found = 0;
    let mut namespaces_found = 0;
    let candidates = keys
        .deprecated
        .into_iter()
        .chain(std::iter::once((keys.name, keys.namespace)));
    for (name_key, namespace_key) in candidates {
        if let Some(v) = params.get(name_key) {
            name = Some(v.clone());
            names_found += 1;
        }
        if let Some(v) = params.get(namespace_key) {
            namespace = Some(v.clone());
            namespaces_found += 1;
        }
    }
    let kind = keys.label;
    if names_found > 1 || namespaces_found > 1 {
        return Err(SecretKeyError::BothKeyStyles { kind });
    }
    match (name, namespace) {
        (None, None) => Ok(None),
        (Some(name), Some(namespace)) => {
            if name.is_empty() || namespace.is_empty() {
                Err(SecretKeyError::EmptyValue { kind })
            } else {
                Ok(Some((name, namespace)))
            }
        }
        _ => Err(SecretKeyError::HalfPair { kind }),
    }
}

/// Resolves the secret reference of `kind` from StorageClass `params`, or `None` when neither the
/// type's keys nor the default keys are set.
pub fn secret_reference(
    kind: SecretKind,
    params: &BTreeMap<String, String>,
    ctx: &TemplateContext<'_>,
) -> Result<Option<SecretRef>, SecretError> {
    let own = templates(&kind.keys(), params).map_err(SecretError::Keys)?;
    let (name_template, namespace_template) = match own {
        Some(pair) => pair,
        None => match templates(&DEFAULT_KEYS, params).map_err(SecretError::DefaultKeys)? {
            Some(pair) => pair,
            None => return Ok(None),
        },
    };

    // The namespace may only depend on things the claim's author does not control.
    let namespace = expand_checked(&namespace_template, |token| match token {
        "pv.name" => Some(ctx.pv_name.to_owned()),
        "pvc.namespace" => ctx.claim.map(|c| c.namespace.to_owned()),
        _ => None,
    })?;
    if !is_dns1123_label(&namespace) {
        return Err(SecretError::InvalidNamespace {
            template: namespace_template,
            resolved: namespace,
        });
    }

    let name = expand_checked(&name_template, |token| match token {
        "pv.name" => Some(ctx.pv_name.to_owned()),
        "pvc.name" => ctx.claim.map(|c| c.name.to_owned()),
        "pvc.namespace" => ctx.claim.map(|c| c.namespace.to_owned()),
        _ => {
            let key = token
                .strip_prefix("pvc.annotations['")
                .and_then(|rest| rest.strip_suffix("']"))?;
            ctx.claim?.annotations?.get(key).cloned()
        }
    })?;
    if !is_dns1123_subdomain(&name) {
        return Err(SecretError::InvalidName {
            template: name_template,
            resolved: name,
        });
    }
    Ok(Some(SecretRef { name, namespace }))
}

/// The provisioner secret to use for DeleteVolume of a PV whose deletion-secret annotations are
/// missing (PVs made by old sidecars): re-derived from the StorageClass `params` with only the PV
/// name and the claim's name and namespace (from `pv.spec.claimRef`) available, so a template using
/// `${pvc.annotations[...]}` is an error here, exactly as upstream. `Ok(None)`: no secret needed.
///
/// PVs we created carry the resolved pair in `volume.kubernetes.io/provisioner-deletion-secret-*`
/// annotations; read those first and call this only when they are absent.
pub fn resolve_provisioner_secret_for_delete(
    params: &BTreeMap<String, String>,
    pv_name: &str,
    claim_name: &str,
    claim_namespace: &str,
) -> Result<Option<SecretRef>, SecretError> {
    let ctx = TemplateContext {
        pv_name,
        claim: Some(ClaimIdentity {
            name: claim_name,
            namespace: claim_namespace,
            annotations: None,
        }),
    };
    secret_reference(SecretKind::Provisioner, params, &ctx)
}

/// Every secret reference a new PV needs, resolved in upstream's order (first error wins).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretRefs {
    /// CreateVolume/DeleteVolume; its data goes into the request, the ref into PV annotations.
    pub provisioner: Option<SecretRef>,
    /// `spec.csi.controllerPublishSecretRef`.
    pub controller_publish: Option<SecretRef>,
    /// `spec.csi.nodeStageSecretRef`.
    pub node_stage: Option<SecretRef>,
    /// `spec.csi.nodePublishSecretRef`.
    pub node_publish: Option<SecretRef>,
    /// `spec.csi.controllerExpandSecretRef`.
    pub controller_expand: Option<SecretRef>,
    /// `spec.csi.nodeExpandSecretRef`.
    pub node_expand: Option<SecretRef>,
    /// The controller-modify PV annotations.
    pub controller_modify: Option<SecretRef>,
}

/// Resolves all seven secret types for provisioning.
pub fn resolve_all(
    params: &BTreeMap<String, String>,
    ctx: &TemplateContext<'_>,
) -> Result<SecretRefs, SecretError> {
    let get = |kind| secret_reference(kind, params, ctx);
    Ok(SecretRefs {
        provisioner: get(SecretKind::Provisioner)?,
        controller_publish: get(SecretKind::ControllerPublish)?,
        node_stage: get(SecretKind::NodeStage)?,
        node_publish: get(SecretKind::NodePublish)?,
        controller_expand: get(SecretKind::ControllerExpand)?,
        node_expand: get(SecretKind::NodeExpand)?,
        controller_modify: get(SecretKind::ControllerModify)?,
    })
}

/// Expands `template` with Go `os.Expand` semantics; tokens `lookup` does not know are collected
/// and reported together.
fn expand_checked(
    template: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, SecretError> {
    let mut missing = BTreeSet::new();
    let expanded = go_expand(template, |token| {
        lookup(token).unwrap_or_else(|| {
            missing.insert(token.to_owned());
            String::new()
        })
    });
    if missing.is_empty() {
        Ok(expanded)
    } else {
        Err(SecretError::InvalidTokens {
            template: template.to_owned(),
            tokens: missing.into_iter().collect(),
        })
    }
}

/// Go's `os.Expand`: `${name}` and `$name` (ASCII alphanumerics and `_`) are replaced via `map`;
/// `$` followed by one of `*#$@!?-0..9` is a one-character special name; `${}` and an unclosed
/// `${` are dropped; a `$` followed by nothing expandable stays literal.
pub fn go_expand(s: &str, mut map: impl FnMut(&str) -> String) -> String {
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut copied_to = 0;
    let mut j = 0;
    while j < bytes.len() {
        if bytes[j] == b'$' && j + 1 < bytes.len() {
            out.push_str(&s[copied_to..j]);
            let (name, width) = shell_name(&s[j + 1..]);
            match name {
                Some(name) => out.push_str(&map(name)),
                // Bad syntax: the consumed characters are eaten.
                None if width > 0 => {}
                // `$` not followed by a name: keep it.
                None => out.push('$'),
            }
            j += width;
            copied_to = j + 1;
        }
        j += 1;
    }
    out.push_str(&s[copied_to.min(s.len())..]);
    out
}

fn is_shell_special(c: u8) -> bool {
    matches!(
        c,
        b'*' | b'#' | b'$' | b'@' | b'!' | b'?' | b'-' | b'0'..=b'9'
    )
}

/// The name at the start of `s` (after a `$`) and how many bytes it spans.
fn shell_name(s: &str) -> (Option<&str>, usize) {
    let b = s.as_bytes();
    if b[0] == b'{' {
        if b.len() > 2 && is_shell_special(b[1]) && b[2] == b'}' {
            return (Some(&s[1..2]), 3);
        }
        return match b.iter().skip(1).position(|&c| c == b'}') {
            Some(0) => (None, 2),
            Some(n) => (Some(&s[1..n + 1]), n + 2),
            None => (None, 1),
        };
    }
    if is_shell_special(b[0]) {
        return (Some(&s[0..1]), 1);
    }
    let n = b
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
        .count();
    if n == 0 {
        (None, 0)
    } else {
        (Some(&s[..n]), n)
    }
}

/// RFC 1123 label: at most 63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// RFC 1123 subdomain: at most 253 characters of dot-separated labels (each label as above,
/// without the 63-character limit, as Kubernetes checks it).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
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
}
