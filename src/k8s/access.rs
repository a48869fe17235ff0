//! The start-up RBAC self-check: which permissions this configuration needs ([`needs`], pure),
//! asked of the API server ([`check`]): one SelfSubjectRulesReview per namespace involved lists
//! what is granted ([`granted_by`], pure), and only the needs it does not show are asked one
//! SelfSubjectAccessReview each (an authorizer that cannot list rules, a webhook, answers
//! `incomplete`; a denial's reason comes from the access review). Every missing permission is
//! named in the log, on `/healthz/rbac` and in a Warning event on the sidecar's Pod, with the
//! ClusterRole (or Role) rule to add ([`rules_to_add`], pure).
//!
//! Upstream finds out about a missing permission only when the first request of that kind fails,
//! often as a retried error on one claim in a verbose log. Asking at start-up costs one request
//! per namespace when everything is granted (20 access reviews before the rules review), sent on
//! their own client so that they never take the workers' rate budget.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, ResourceRule, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

use crate::retry::describe;

/// One permission the sidecar needs: `verb` on `resource` of API `group`, cluster-wide or in
/// `namespace`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Need {
    pub(crate) group: &'static str,
    pub(crate) resource: &'static str,
    pub(crate) verb: &'static str,
    /// `Some` for a namespaced grant (a Role), `None` for a ClusterRole rule.
    pub(crate) namespace: Option<String>,
    /// What fails without it, for the operator.
    pub(crate) purpose: &'static str,
}

/// The features a configuration enables that change what it needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Features {
    /// Nodes and CSINodes are read (topology, node-deployment mode, deleted-node checks).
    pub(crate) nodes: bool,
    /// The driver has PUBLISH_UNPUBLISH_VOLUME: VolumeAttachments guard deletion.
    pub(crate) attachments: bool,
    /// `--deleted-node-pvc-cleanup`: claims bound to volumes of deleted nodes are deleted.
    pub(crate) claim_cleanup: bool,
    /// `--leader-election`: the namespace of the Lease.
    pub(crate) leader_election_namespace: Option<String>,
    /// `--enable-capacity`: the namespace of the CSIStorageCapacity objects (`NAMESPACE`).
    pub(crate) capacity_namespace: Option<String>,
    /// The namespace of the intent ledger's Leases.
    pub(crate) ledger_namespace: Option<String>,
    /// Node mode: every node has a ledger, and a gone node's is deleted by the clean-up.
    pub(crate) node_ledgers: bool,
    /// `--track-unused-claims`: Pods are watched.
    pub(crate) pods: bool,
}

/// Every permission a sidecar with `features` needs, in a stable order.
pub(crate) fn needs(features: &Features) -> Vec<Need> {
    let mut out = Vec::new();
    let mut add = |group, resource, verbs: &[&'static str], namespace: Option<&str>, purpose| {
        for verb in verbs {
            out.push(Need {
                group,
                resource,
                verb,
                namespace: namespace.map(str::to_owned),
                purpose,
            });
        }
    };
    add(
        "",
        "persistentvolumes",
        &["get", "list", "watch", "create", "patch", "delete"],
        None,
        "create, protect and delete the PVs of provisioned volumes",
    );
    // PATCH on claims is optional: without it the same writes are made as GET + update.
    add(
        "",
        "persistentvolumeclaims",
        &["get", "list", "watch", "update"],
        None,
        "find claims to provision and record the provisioning intent on them",
    );
    add(
        "storage.k8s.io",
        "storageclasses",
        &["get", "list", "watch"],
        None,
        "read the StorageClass of each claim",
    );
    add(
        "",
        "events",
        &["create", "patch"],
        None,
        "report provisioning and deletion outcomes as events",
    );
    if features.nodes {
        add(
            "",
            "nodes",
            &["get", "list", "watch"],
            None,
            "read node topology and notice deleted nodes",
        );
        add(
            "storage.k8s.io",
            "csinodes",
            &["get", "list", "watch"],
            None,
            "find the nodes running the driver and their topology keys",
        );
    }
    if features.attachments {
        add(
            "storage.k8s.io",
            "volumeattachments",
            &["list", "watch"],
            None,
            "never delete a volume that is still attached to a node",
        );
    }
    if features.pods {
        add(
            "",
            "pods",
            &["list", "watch"],
            None,
            "see which claims Pods use (--track-unused-claims)",
        );
    }
    if features.claim_cleanup {
        add(
            "",
            "persistentvolumeclaims",
            &["delete"],
            None,
            "delete claims bound to volumes of deleted nodes (--deleted-node-pvc-cleanup)",
        );
    }
    if let Some(namespace) = &features.leader_election_namespace {
        add(
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"],
            Some(namespace),
            "elect a leader with a Lease (--leader-election)",
        );
    }
    if let Some(namespace) = &features.ledger_namespace {
        add(
            "coordination.k8s.io",
            "leases",
            &["list", "create", "update"],
            Some(namespace),
            "record provisioning intents in the intent ledger (else two claim writes per volume)",
        );
        if features.node_ledgers {
            add(
                "coordination.k8s.io",
                "leases",
                &["delete"],
                Some(namespace),
                "delete the intent ledgers of nodes that no longer exist",
            );
        }
    }
    if let Some(namespace) = &features.capacity_namespace {
        add(
            "storage.k8s.io",
            "csistoragecapacities",
            &["get", "list", "watch", "create", "update", "delete"],
            Some(namespace),
            "publish storage capacity (--enable-capacity)",
        );
    }
    // Leader election and the ledger share a namespace by default: ask once per permission.
    let mut seen = std::collections::HashSet::new();
    out.retain(|n| seen.insert((n.group, n.resource, n.verb, n.namespace.clone())));
    out
}

/// A permission the API server says this identity lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Missing {
    pub(crate) need: Need,
    /// The authorizer's reason, when it gave one.
    pub(crate) reason: String,
}

impl Missing {
    /// One line for the log, `/healthz/rbac` and the event.
    pub(crate) fn describe(&self) -> String {
        let n = &self.need;
        let resource = match n.group {
            "" => n.resource.to_owned(),
            group => format!("{}.{group}", n.resource),
        };
        let scope = match &n.namespace {
            Some(ns) => format!(" in namespace {ns}"),
            None => String::new(),
        };
        let reason = match self.reason.as_str() {
            "" => String::new(),
            reason => format!(" ({reason})"),
        };
        format!(
            "cannot {} {resource}{scope}, needed to {}{reason}",
            n.verb, n.purpose
        )
    }
}

/// The rules to add, as YAML: a ClusterRole block for cluster-wide needs and a Role block per
/// namespace, each rule listing the missing verbs of one resource.
pub(crate) fn rules_to_add(missing: &[Missing]) -> String {
    // (namespace, group, resource) -> verbs, in a stable order.
    let mut rules: BTreeMap<(Option<&str>, &str, &str), Vec<&str>> = BTreeMap::new();
    for m in missing {
        let n = &m.need;
        let verbs = rules
            .entry((n.namespace.as_deref(), n.group, n.resource))
            .or_default();
        if !verbs.contains(&n.verb) {
            verbs.push(n.verb);
        }
    }
    let mut out = String::new();
    let mut scope = None;
    for ((namespace, group, resource), verbs) in rules {
        if scope != Some(namespace) {
            scope = Some(namespace);
            match namespace {
                None => out.push_str("# ClusterRole bound to the sidecar's ServiceAccount:\n"),
                Some(ns) => {
                    let _ = writeln!(
                        out,
                        "# Role in namespace {ns} bound to the sidecar's ServiceAccount:"
                    );
                }
            }
        }
        let quoted = |items: &[&str]| {
            items
                .iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "- apiGroups: [{}]\n  resources: [{}]\n  verbs: [{}]",
            quoted(&[group]),
            quoted(&[resource]),
            quoted(&verbs)
        );
    }
    out
}

/// Whether `rules` (a rules review's answer for the need's namespace) grant `need`: a rule naming
/// its group, resource and verb (or `*`) without restricting resource names. Cluster-scoped needs
/// are read from the same answer, which lists the ClusterRoles' rules with the namespace's Roles.
pub(crate) fn granted_by(rules: &[ResourceRule], need: &Need) -> bool {
    let has = |list: Option<&Vec<String>>, want: &str| {
        list.is_some_and(|l| l.iter().any(|v| v == "*" || v == want))
    };
    rules.iter().any(|rule| {
        rule.verbs.iter().any(|v| v == "*" || v == need.verb)
            && has(rule.api_groups.as_ref(), need.group)
            && has(rule.resources.as_ref(), need.resource)
            && rule.resource_names.as_ref().is_none_or(Vec::is_empty)
    })
}

/// The namespaces to ask a rules review for: every namespace of a namespaced need, or `default`
/// when all needs are cluster-wide (any namespace lists the cluster-wide rules).
fn review_namespaces(needs: &[Need]) -> Vec<String> {
    let mut namespaces: Vec<String> = needs.iter().filter_map(|n| n.namespace.clone()).collect();
    namespaces.sort();
    namespaces.dedup();
    if namespaces.is_empty() {
        namespaces.push("default".to_owned());
    }
    namespaces
}

/// The rules granted in `namespace` per a rules review; `None` when the API server does not
/// answer one (older servers, a refusal): every need is then asked with an access review.
async fn rules_in(client: &kube::Client, namespace: &str) -> Option<Vec<ResourceRule>> {
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.to_owned()),
        },
        ..Default::default()
    };
    match Api::<SelfSubjectRulesReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
    {
        Ok(answer) => answer.status.map(|s| s.resource_rules),
        Err(error) => {
            tracing::debug!(error = %describe(&error), namespace, "SelfSubjectRulesReview not answered; asking per permission");
            None
        }
    }
}

/// Asks the API server about each need: the needs a rules review shows granted are done, the
/// others get an access review each (concurrently). Returns the denied ones.
pub(crate) async fn check(
    client: &kube::Client,
    needs: &[Need],
) -> Result<Vec<Missing>, kube::Error> {
    let namespaces = review_namespaces(needs);
    let answers = futures::future::join_all(namespaces.iter().map(|ns| rules_in(client, ns))).await;
    let rules: BTreeMap<&str, Vec<ResourceRule>> = namespaces
        .iter()
        .zip(answers)
        .filter_map(|(ns, rules)| Some((ns.as_str(), rules?)))
        .collect();
    let shown = |need: &Need| {
        let namespace = need
            .namespace
            .as_deref()
            .unwrap_or_else(|| namespaces[0].as_str());
        rules
            .get(namespace)
            .is_some_and(|rules| granted_by(rules, need))
    };
    let unproven: Vec<&Need> = needs.iter().filter(|n| !shown(n)).collect();
    let api = Api::<SelfSubjectAccessReview>::all(client.clone());
    let reviews = unproven.into_iter().map(|need| {
        let api = api.clone();
        async move {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(need.group.to_owned()),
                        resource: Some(need.resource.to_owned()),
                        verb: Some(need.verb.to_owned()),
                        namespace: need.namespace.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let answer = api.create(&PostParams::default(), &review).await?;
            let status = answer.status.unwrap_or_default();
            Ok::<_, kube::Error>((!status.allowed).then(|| Missing {
                need: need.clone(),
                reason: status.reason.unwrap_or_default(),
            }))
        }
    });
    // The first failed review fails the check.
    futures::future::join_all(reviews)
        .await
        .into_iter()
        .filter_map(Result::transpose)
        .collect()
}

/// The start-up self-check: asks about every need and logs the outcome. Returns the missing
/// permissions, or `None` when the API server could not answer (an old or unusual authorizer;
/// nothing is claimed then).
pub(crate) async fn self_check(client: &kube::Client, features: &Features) -> Option<Vec<Missing>> {
    let needs = needs(features);
    match check(client, &needs).await {
        Ok(missing) if missing.is_empty() => {
            tracing::info!(
                checked = needs.len(),
                "RBAC self-check: every permission this configuration needs is granted"
            );
            Some(missing)
        }
        Ok(missing) => {
            for m in &missing {
                tracing::error!("missing RBAC permission: {}", m.describe());
            }
            tracing::error!(
                "add these rules to the sidecar's RBAC (deploy/rbac.yaml has them all), then restart it:\n{}",
                rules_to_add(&missing)
            );
            Some(missing)
        }
        Err(error) => {
            tracing::warn!(error = %describe(&error), "RBAC self-check skipped: the API server did not answer a SelfSubjectAccessReview");
            None
        }
    }
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
