//! `DIFF_WORLD=real`: which scenarios a real Kubernetes 1.20 control plane can express. A
//! scenario that needs an API, field or behaviour 1.20 lacks (or that only kube-sim has) is
//! reported as not fitting, with why, and skipped: never run to a vacuous agreement.

use serde_json::Value;

use crate::scenario::{Scenario, Step};

/// Every object the scenario makes: those before the sidecar starts and those of `create` steps.
fn objects(s: &Scenario) -> Vec<&Value> {
    let steps = s.steps.iter().chain(&s.while_down);
    let created = steps.filter_map(|step| match step {
        Step::Create(objs) => Some(objs.iter()),
        _ => None,
    });
    s.objects.iter().chain(created.flatten()).collect()
}

fn of_kind<'a>(objs: &[&'a Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().copied().filter(|o| o["kind"] == kind).collect()
}

/// Why the scenario does not fit a real 1.20 control plane, or `None` when it does.
pub fn misfit(s: &Scenario) -> Option<String> {
    let objs = objects(s);
    let claims = of_kind(&objs, "PersistentVolumeClaim");
    let classes = of_kind(&objs, "StorageClass");
    let flags = || s.sidecar.iter().chain(&s.ours);

    if !of_kind(&objs, "VolumeAttributesClass").is_empty()
        || claims
            .iter()
            .any(|c| !c["spec"]["volumeAttributesClassName"].is_null())
    {
        return Some(
            "VolumeAttributesClass: Kubernetes 1.20 has no such API (storage.k8s.io, 1.29 on)"
                .into(),
        );
    }
    if claims.iter().any(|c| !c["spec"]["dataSourceRef"].is_null()) {
        return Some(
            "spec.dataSourceRef: Kubernetes 1.20 has no such claim field (1.22 on; populators \
             and cross-namespace sources need it)"
                .into(),
        );
    }
    if claims.iter().any(|c| {
        c["spec"]["accessModes"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m == "ReadWriteOncePod"))
    }) {
        return Some("ReadWriteOncePod: Kubernetes 1.20 has no such access mode (1.22 on)".into());
    }
    // 1.20 keeps only these two sources while AnyVolumeDataSource (alpha) is off.
    if let Some(source) = claims.iter().map(|c| &c["spec"]["dataSource"]).find(|d| {
        let core_claim = d["kind"] == "PersistentVolumeClaim"
            && (d["apiGroup"].is_null() || d["apiGroup"] == "");
        let snapshot = d["kind"] == "VolumeSnapshot" && d["apiGroup"] == "snapshot.storage.k8s.io";
        !d.is_null() && !core_claim && !snapshot
    }) {
        return Some(format!(
            "a dataSource of {}/{}: Kubernetes 1.20 drops it from the claim (only claims and \
             snapshot.storage.k8s.io snapshots while AnyVolumeDataSource, alpha, is off)",
            source["apiGroup"].as_str().unwrap_or(""),
            source["kind"].as_str().unwrap_or("")
        ));
    }
    if !of_kind(&objs, "ReferenceGrant").is_empty() {
        return Some(
            "ReferenceGrant: the Gateway API CRD is not installed on the real control plane".into(),
        );
    }
    if flags().any(|f| f == "--enable-capacity") {
        return Some(
            "--enable-capacity: Kubernetes 1.20 serves CSIStorageCapacity only as v1alpha1 \
             behind a feature gate (v1 from 1.24)"
                .into(),
        );
    }
    if objs.iter().any(|o| {
        !o["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"].is_null()
    }) {
        return Some(
            "the GA annotation volume.kubernetes.io/storage-provisioner: Kubernetes 1.20's PV \
             controller sets and knows only the beta one"
                .into(),
        );
    }
    if let Some(plugin) = classes
        .iter()
        .filter_map(|c| c["provisioner"].as_str())
        .find(|p| p.starts_with("kubernetes.io/"))
    {
        return Some(format!(
            "CSI migration of {plugin}: the real control plane runs without the \
             CSIMigration<Plugin> feature gates (most are off by default in 1.20), so its PV \
             controller treats the in-tree class and PVs itself and never hands them to a CSI \
             driver"
        ));
    }
    // kube-sim selects the node a scenario names; the real scheduler never places a pod on a
    // node outside the allowed topologies of its claim's WaitForFirstConsumer class.
    for pod in of_kind(&objs, "Pod") {
        let Some(node) = pod["spec"]["nodeName"].as_str() else {
            continue;
        };
        let excluded = classes.iter().any(|c| {
            c["allowedTopologies"].as_array().is_some_and(|terms| {
                !terms.iter().any(|t| {
                    t["matchLabelExpressions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .all(|e| {
                            e["values"]
                                .as_array()
                                .is_some_and(|v| v.iter().any(|v| v == node))
                        })
                })
            })
        });
        if excluded {
            return Some(format!(
                "a pod on {node}, outside its class's allowedTopologies: the real scheduler \
                 never selects such a node (kube-sim selects the node a scenario names)"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::misfit;
    use crate::scenario::Scenario;

    fn scenario(text: &str) -> Scenario {
        serde_saphyr::from_str(text).expect("scenario")
    }

    #[test]
    fn a_plain_claim_fits_and_1_20_gaps_do_not() {
        let plain = scenario(
            "about: x\nsteps:\n  - create: [{kind: PersistentVolumeClaim, metadata: {name: c}, \
             spec: {accessModes: [ReadWriteOnce]}}]\n",
        );
        assert_eq!(misfit(&plain), None);
        let rwop = scenario(
            "about: x\nsteps:\n  - create: [{kind: PersistentVolumeClaim, metadata: {name: c}, \
             spec: {accessModes: [ReadWriteOncePod]}}]\n",
        );
        assert!(misfit(&rwop).unwrap().contains("ReadWriteOncePod"));
        let claim_from = |source: &str| {
            scenario(&format!(
                "about: x\nsteps:\n  - create: [{{kind: PersistentVolumeClaim, metadata: \
                 {{name: c}}, spec: {{dataSource: {source}}}}}]\n"
            ))
        };
        let restore = "{apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: s}";
        assert_eq!(misfit(&claim_from(restore)), None);
        assert_eq!(
            misfit(&claim_from("{kind: PersistentVolumeClaim, name: s}")),
            None
        );
        let other = "{apiGroup: example.com, kind: VolumeSnapshot, name: s}";
        assert!(misfit(&claim_from(other)).unwrap().contains("drops it"));
        let capacity = scenario("about: x\nsidecar: [--enable-capacity]\n");
        assert!(misfit(&capacity).unwrap().contains("CSIStorageCapacity"));
    }

    #[test]
    fn a_pod_outside_the_allowed_topologies_does_not_fit() {
        let text = "about: x\nobjects:\n  - {kind: StorageClass, metadata: {name: f}, \
                    allowedTopologies: [{matchLabelExpressions: [{key: k, values: [node-1]}]}]}\n\
                    steps:\n  - create: [{kind: Pod, metadata: {name: p}, spec: {nodeName: NODE}}]\n";
        assert_eq!(misfit(&scenario(&text.replace("NODE", "node-1"))), None);
        assert!(
            misfit(&scenario(&text.replace("NODE", "node-2")))
                .unwrap()
                .contains("allowedTopologies")
        );
    }
}
