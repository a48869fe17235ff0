//! StorageClass secret references: which parameter keys name the secret of each CSI call, the
//! `${...}` templates in them, and the validation upstream applies (reference §3.5), all pure; and
//! the one read of a secret's data for a CSI call ([`credentials`]), whose values go into CSI
//! requests only, never into logs, events or errors.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use k8s_openapi::api::core::v1::{Secret, SecretReference};
use kube::{Api, Client};

use crate::gofmt;
use crate::names;

/// The CSI calls a StorageClass can name a secret for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SecretKind {
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
    pub(crate) const ALL: [SecretKind; 7] = [
        SecretKind::Provisioner,
        SecretKind::ControllerPublish,
        SecretKind::NodeStage,
        SecretKind::NodePublish,
        SecretKind::ControllerExpand,
        SecretKind::NodeExpand,
        SecretKind::ControllerModify,
    ];

    /// The `(name, namespace)` parameter keys of the type.
    pub(crate) fn keys_in_params(self) -> (&'static str, &'static str) {
        let keys = self.keys();
        (keys.name, keys.namespace)
    }

    /// The deprecated `(name, namespace)` keys, for the four types that have them.
    pub(crate) fn deprecated_keys_in_params(self) -> Option<(&'static str, &'static str)> {
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
pub(crate) struct SecretRef {
    /// Secret name (a DNS-1123 subdomain).
    pub(crate) name: String,
    /// Secret namespace (a DNS-1123 label).
    pub(crate) namespace: String,
}

impl SecretRef {
    /// Convenience constructor.
    pub(crate) fn new(name: impl Into<String>, namespace: impl Into<String>) -> Self {
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
pub(crate) struct ClaimIdentity<'a> {
    /// `${pvc.name}`.
    pub(crate) name: &'a str,
    /// `${pvc.namespace}`.
    pub(crate) namespace: &'a str,
    /// `${pvc.annotations['KEY']}`; `None` when they are not known (deletion), which makes any
    /// annotation token invalid.
    pub(crate) annotations: Option<&'a BTreeMap<String, String>>,
}

/// What templates may refer to: the PV name always, the claim when one is known.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TemplateContext<'a> {
    /// `${pv.name}`.
    pub(crate) pv_name: &'a str,
    /// The claim, if any.
    pub(crate) claim: Option<ClaimIdentity<'a>>,
}

/// Why the secret keys of a StorageClass are unusable (before any template is expanded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SecretKeyError {
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
pub(crate) enum SecretError {
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
pub(crate) fn secret_reference(
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
pub(crate) fn resolve_provisioner_secret_for_delete(
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
pub(crate) struct SecretRefs {
    /// CreateVolume/DeleteVolume; its data goes into the request, the ref into PV annotations.
    pub(crate) provisioner: Option<SecretRef>,
    /// `spec.csi.controllerPublishSecretRef`.
    pub(crate) controller_publish: Option<SecretRef>,
    /// `spec.csi.nodeStageSecretRef`.
    pub(crate) node_stage: Option<SecretRef>,
    /// `spec.csi.nodePublishSecretRef`.
    pub(crate) node_publish: Option<SecretRef>,
    /// `spec.csi.controllerExpandSecretRef`.
    pub(crate) controller_expand: Option<SecretRef>,
    /// `spec.csi.nodeExpandSecretRef`.
    pub(crate) node_expand: Option<SecretRef>,
    /// The controller-modify PV annotations.
    pub(crate) controller_modify: Option<SecretRef>,
}

/// Resolves all seven secret types for provisioning.
pub(crate) fn resolve_all(
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
pub(crate) fn go_expand(s: &str, mut map: impl FnMut(&str) -> String) -> String {
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
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label(s)
}

/// RFC 1123 subdomain: at most 253 characters of dot-separated labels (each label as above,
/// without the 63-character limit, as Kubernetes checks it).
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

/// `[a-z0-9-]`, not empty, starting and ending alphanumeric.
fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

// === The secret's data ===

/// A Secret could not be read; the message has upstream's wording and never a value.
#[derive(Debug, thiserror::Error)]
#[error(
    "error getting secret {name} in namespace {namespace}: {}",
    crate::retry::describe(source)
)]
pub(crate) struct SecretFetchError {
    /// Secret name.
    pub(crate) name: String,
    /// Secret namespace.
    pub(crate) namespace: String,
    /// The API error.
    #[source]
    pub(crate) source: kube::Error,
}

/// The data of Secret `namespace/name` as CSI wants it: key -> UTF-8 value.
pub(crate) async fn credentials(
    client: &Client,
    name: &str,
    namespace: &str,
) -> Result<HashMap<String, String>, SecretFetchError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = api.get(name).await.map_err(|source| SecretFetchError {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        source,
    })?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

#[cfg(test)]
#[path = "secrets_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "secrets_props_tests.rs"]
mod props_tests;
