use super::*;

fn missing(
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    ns: Option<&str>,
) -> Missing {
    Missing {
        need: Need {
            group,
            resource,
            verb,
            namespace: ns.map(str::to_owned),
            purpose: "test",
        },
        reason: String::new(),
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> ResourceRule {
    let owned = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    ResourceRule {
        api_groups: Some(owned(groups)),
        resources: Some(owned(resources)),
        verbs: owned(verbs),
        resource_names: (!names.is_empty()).then(|| owned(names)),
    }
}

#[test]
fn a_rules_review_grants_what_a_rule_names_or_wildcards_and_nothing_narrower() {
    let need = |group, resource, verb| Need {
        group,
        resource,
        verb,
        namespace: None,
        purpose: "test",
    };
    let pv_create = need("", "persistentvolumes", "create");
    let lease_update = need("coordination.k8s.io", "leases", "update");
    assert!(granted_by(
        &[rule(&[""], &["persistentvolumes"], &["get", "create"], &[])],
        &pv_create
    ));
    assert!(granted_by(
        &[rule(&["*"], &["*"], &["*"], &[])],
        &lease_update
    ));
    // Another group, another verb, a subresource, or only some names: not shown granted.
    assert!(!granted_by(
        &[rule(
            &["storage.k8s.io"],
            &["persistentvolumes"],
            &["*"],
            &[]
        )],
        &pv_create
    ));
    assert!(!granted_by(
        &[rule(&[""], &["persistentvolumes"], &["get"], &[])],
        &pv_create
    ));
    assert!(!granted_by(
        &[rule(&[""], &["persistentvolumes/status"], &["create"], &[])],
        &pv_create
    ));
    assert!(!granted_by(
        &[rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["update"],
            &["my-lease"]
        )],
        &lease_update
    ));
    assert!(!granted_by(&[], &pv_create));
}

#[test]
fn rules_are_asked_once_per_namespace_of_the_needs() {
    let all = needs(&Features {
        leader_election_namespace: Some("kube-system".into()),
        ledger_namespace: Some("kube-system".into()),
        capacity_namespace: Some("csi".into()),
        ..Features::default()
    });
    assert_eq!(review_namespaces(&all), ["csi", "kube-system"]);
    assert_eq!(review_namespaces(&needs(&Features::default())), ["default"]);
}

#[test]
fn the_base_needs_are_upstreams_cluster_role_less_the_optional_verbs() {
    let base = needs(&Features::default());
    let has = |resource: &str, verb: &str| {
        base.iter()
            .any(|n| n.resource == resource && n.verb == verb)
    };
    assert!(has("persistentvolumes", "create") && has("persistentvolumes", "delete"));
    assert!(has("persistentvolumeclaims", "update"));
    // PATCH on claims has a GET + update fallback; deleting claims is opt-in.
    assert!(!has("persistentvolumeclaims", "patch"));
    assert!(!has("persistentvolumeclaims", "delete"));
    assert!(
        !base
            .iter()
            .any(|n| n.resource == "nodes" || n.resource == "leases")
    );
    assert!(base.iter().all(|n| n.namespace.is_none()));
}

#[test]
fn features_add_their_needs_and_leases_are_namespaced() {
    let all = needs(&Features {
        nodes: true,
        attachments: true,
        claim_cleanup: true,
        leader_election_namespace: Some("kube-system".into()),
        capacity_namespace: Some("csi".into()),
        ledger_namespace: Some("kube-system".into()),
        node_ledgers: true,
        pods: true,
    });
    assert!(
        all.iter()
            .any(|n| n.resource == "pods" && n.verb == "watch")
    );
    let find = |resource: &str, verb: &str| {
        all.iter()
            .find(|n| n.resource == resource && n.verb == verb)
            .cloned()
    };
    assert!(find("csinodes", "watch").is_some());
    assert!(find("volumeattachments", "list").is_some());
    assert!(find("persistentvolumeclaims", "delete").is_some());
    let lease = find("leases", "update").expect("lease update");
    assert_eq!(lease.namespace.as_deref(), Some("kube-system"));
    assert_eq!(lease.group, "coordination.k8s.io");
    assert!(
        find("leases", "list").is_some(),
        "the ledger is loaded with a list"
    );
    let updates = all
        .iter()
        .filter(|n| n.resource == "leases" && n.verb == "update")
        .count();
    assert_eq!(updates, 1, "one check per permission");
    let capacity = find("csistoragecapacities", "create").expect("capacity create");
    assert_eq!(capacity.namespace.as_deref(), Some("csi"));
}

#[test]
fn the_rules_to_add_group_verbs_per_resource_and_roles_per_namespace() {
    let yaml = rules_to_add(&[
        missing("", "persistentvolumes", "create", None),
        missing("", "persistentvolumes", "delete", None),
        missing("storage.k8s.io", "csinodes", "list", None),
        missing("coordination.k8s.io", "leases", "update", Some("ops")),
    ]);
    assert_eq!(
        yaml,
        "# ClusterRole bound to the sidecar's ServiceAccount:\n\
         - apiGroups: [\"\"]\n  resources: [\"persistentvolumes\"]\n  verbs: [\"create\", \"delete\"]\n\
         - apiGroups: [\"storage.k8s.io\"]\n  resources: [\"csinodes\"]\n  verbs: [\"list\"]\n\
         # Role in namespace ops bound to the sidecar's ServiceAccount:\n\
         - apiGroups: [\"coordination.k8s.io\"]\n  resources: [\"leases\"]\n  verbs: [\"update\"]\n"
    );
}

#[test]
fn a_missing_permission_reads_as_what_fails_and_why() {
    let mut m = missing("storage.k8s.io", "csinodes", "watch", None);
    m.reason = "RBAC: no rule".into();
    assert_eq!(
        m.describe(),
        "cannot watch csinodes.storage.k8s.io, needed to test (RBAC: no rule)"
    );
    let lease = missing("coordination.k8s.io", "leases", "get", Some("ops"));
    assert_eq!(
        lease.describe(),
        "cannot get leases.coordination.k8s.io in namespace ops, needed to test"
    );
}
