//! kube-sim kept honest: the same API requests sent to kube-sim and to the real Kubernetes 1.20.2
//! API server (`tests/real-cluster/build.sh`), answer for answer. Each probe records what the real
//! server answers (status code, reason, message, and for successes the fields a probe reads);
//! kube-sim must answer the same, unless the probe names why it differs on purpose (kube-sim
//! models a current Kubernetes, 1.33+; 1.20 is older). On the real server the recorded answers are
//! checked too, so the record cannot drift from what it records. Without the real control plane
//! only kube-sim is checked. docs/testing.md lists the divergences found this way.

mod common;

use common::real_cluster::RealCluster;
use std::path::Path;

use http::Request;
use kube::client::Body;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use kube_sim::{Sim, SimConfig};
use serde_json::{Value, json};

/// One request and what the real 1.20 server answers to it.
struct Probe {
    what: &'static str,
    method: &'static str,
    path: &'static str,
    content_type: &'static str,
    body: Option<Value>,
    /// Status code, `reason` (empty for a success) and `message` (for a failure: its first line,
    /// UUIDs shown as `<uid>` and numbers in parentheses as `(<n>)`).
    code: u16,
    reason: &'static str,
    message: &'static str,
    /// For a success: JSON pointers into the answer and the value the real server has there
    /// (`Value::Null`: absent).
    fields: Vec<(&'static str, Value)>,
    /// Where kube-sim answers otherwise on purpose: why (a version difference), and its answer.
    sim: Option<SimAnswer>,
}

struct SimAnswer {
    why: &'static str,
    code: u16,
    reason: &'static str,
    message: &'static str,
}

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";

fn probe(what: &'static str, method: &'static str, path: &'static str) -> Probe {
    Probe {
        what,
        method,
        path,
        content_type: JSON,
        body: None,
        code: 200,
        reason: "",
        message: "",
        fields: Vec::new(),
        sim: None,
    }
}

impl Probe {
    fn body(mut self, content_type: &'static str, body: Value) -> Self {
        self.content_type = content_type;
        self.body = Some(body);
        self
    }
    fn answers(mut self, code: u16, reason: &'static str, message: &'static str) -> Self {
        self.code = code;
        self.reason = reason;
        self.message = message;
        self
    }
    fn fields(mut self, fields: &[(&'static str, Value)]) -> Self {
        self.fields = fields.to_vec();
        self
    }
    fn sim_differs(
        mut self,
        why: &'static str,
        code: u16,
        reason: &'static str,
        message: &'static str,
    ) -> Self {
        self.sim = Some(SimAnswer {
            why,
            code,
            reason,
            message,
        });
        self
    }
}

fn pv(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
           "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "csi": {"driver": "mock.csi.rs", "volumeHandle": name}}})
}

fn pvc(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "none",
                    "resources": {"requests": {"storage": "1Gi"}}}})
}

/// The probes, in order: later ones use objects earlier ones made.
fn probes() -> Vec<Probe> {
    vec![
        // --- creation, defaults, initial status ---
        probe("create a namespace", "POST", "/api/v1/namespaces")
            .body(JSON, json!({"metadata": {"name": "probe"}}))
            .answers(201, "", ""),
        probe("create a PV", "POST", "/api/v1/persistentvolumes")
            .body(JSON, pv("pv-a"))
            .answers(201, "", ""),
        probe("read the PV back", "GET", "/api/v1/persistentvolumes/pv-a"),
        probe("create a claim", "POST", "/api/v1/namespaces/probe/persistentvolumeclaims")
            .body(JSON, pvc("claim-a"))
            .answers(201, "", ""),
        probe(
            "create a StorageClass",
            "POST",
            "/apis/storage.k8s.io/v1/storageclasses",
        )
        .body(
            JSON,
            json!({"metadata": {"name": "sc-a"}, "provisioner": "mock.csi.rs", "parameters": {"a": "b"}}),
        )
            .answers(201, "", ""),
        // --- errors of the common verbs ---
        probe("get a missing PV", "GET", "/api/v1/persistentvolumes/nope")
            .answers(404, "NotFound", "persistentvolumes \"nope\" not found"),
        probe("create a PV twice", "POST", "/api/v1/persistentvolumes").body(JSON, pv("pv-a"))
            .answers(409, "AlreadyExists", "persistentvolumes \"pv-a\" already exists"),
        probe(
            "create in a missing namespace",
            "POST",
            "/api/v1/namespaces/nope/persistentvolumeclaims",
        )
        .body(JSON, pvc("claim-x"))
            .answers(404, "NotFound", "namespaces \"nope\" not found"),
        probe(
            "namespace of the body differs from the URL",
            "POST",
            "/api/v1/namespaces/probe/persistentvolumeclaims",
        )
        .body(
            JSON,
            json!({"metadata": {"name": "c", "namespace": "other"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
        )
            .answers(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request"),
        probe(
            "create with a resourceVersion",
            "POST",
            "/api/v1/persistentvolumes",
        )
        .body(
            JSON,
            json!({"metadata": {"name": "pv-rv", "resourceVersion": "5"}, "spec": pv("x")["spec"]}),
        )
            .answers(500, "", "resourceVersion should not be set on objects to be created"),
        probe("update with a stale resourceVersion", "PUT", "/api/v1/persistentvolumes/pv-a").body(
            JSON,
            json!({"metadata": {"name": "pv-a", "resourceVersion": "1"}, "spec": pv("pv-a")["spec"]}),
        )
            .answers(409, "Conflict", "Operation cannot be fulfilled on persistentvolumes \"pv-a\": the object has been modified; please apply your changes to the latest version and try again"),
        probe("update with another name", "PUT", "/api/v1/persistentvolumes/pv-a")
            .body(JSON, pv("pv-b"))
            .answers(400, "BadRequest", "the name of the object (pv-b) does not match the name on the URL (pv-a)"),
        probe("delete a missing claim", "DELETE", "/api/v1/namespaces/probe/persistentvolumeclaims/nope")
            .answers(404, "NotFound", "persistentvolumeclaims \"nope\" not found"),
        probe("merge-patch a missing PV", "PATCH", "/api/v1/persistentvolumes/nope")
            .body(MERGE, json!({"metadata": {"labels": {"a": "b"}}}))
            .answers(404, "NotFound", "persistentvolumes \"nope\" not found"),
        probe("JSON patch whose test fails", "PATCH", "/api/v1/persistentvolumes/pv-a").body(
            JSON_PATCH,
            json!([{"op": "test", "path": "/metadata/name", "value": "other"}]),
        )
            .answers(422, "Invalid", "the server rejected our request due to an error in our request"),
        probe("patch of an unknown content type", "PATCH", "/api/v1/persistentvolumes/pv-a")
            .body("text/plain", json!({}))
            .answers(415, "UnsupportedMediaType", "415: Unsupported Media Type"),
        // --- validation ---
        probe("PV without capacity, modes or source", "POST", "/api/v1/persistentvolumes")
            .body(JSON, json!({"metadata": {"name": "pv-bad"}, "spec": {}}))
            .answers(422, "Invalid", "PersistentVolume \"pv-bad\" is invalid: [spec.accessModes: Required value, spec.capacity: Required value, spec.capacity: Unsupported value: core.ResourceList(nil): supported values: \"storage\", spec: Required value: must specify a volume type]"),
        probe("PV with a bad name", "POST", "/api/v1/persistentvolumes")
            .body(JSON, json!({"metadata": {"name": "Bad_Name"}, "spec": pv("x")["spec"]}))
            .answers(422, "Invalid", "PersistentVolume \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
        probe(
            "claim without a size",
            "POST",
            "/api/v1/namespaces/probe/persistentvolumeclaims",
        )
        .body(
            JSON,
            json!({"metadata": {"name": "c-nosize"}, "spec": {"accessModes": ["ReadWriteOnce"]}}),
        )
            .answers(422, "Invalid", "PersistentVolumeClaim \"c-nosize\" is invalid: spec.resources[storage]: Required value"),
        probe(
            "claim without access modes",
            "POST",
            "/api/v1/namespaces/probe/persistentvolumeclaims",
        )
        .body(
            JSON,
            json!({"metadata": {"name": "c-nomode"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}),
        )
            .answers(422, "Invalid", "PersistentVolumeClaim \"c-nomode\" is invalid: spec.accessModes: Required value: at least 1 access mode is required"),
        probe(
            "claim's storage class changed",
            "PATCH",
            "/api/v1/namespaces/probe/persistentvolumeclaims/claim-a",
        )
        .body(MERGE, json!({"spec": {"storageClassName": "other"}}))
            .answers(422, "Invalid", "PersistentVolumeClaim \"claim-a\" is invalid: spec: Forbidden: spec is immutable after creation except resources.requests for bound claims")
            .sim_differs(
                "version: 1.29+ may change volumeAttributesClassName too, and say so",
                422,
                "Invalid",
                "PersistentVolumeClaim \"claim-a\" is invalid: spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
            ),
        probe(
            "StorageClass parameters changed",
            "PATCH",
            "/apis/storage.k8s.io/v1/storageclasses/sc-a",
        )
        .body(MERGE, json!({"parameters": {"a": "c"}}))
            .answers(422, "Invalid", "StorageClass.storage.k8s.io \"sc-a\" is invalid: parameters: Forbidden: updates to parameters are forbidden."),
        probe(
            "StorageClass with a bad reclaim policy",
            "POST",
            "/apis/storage.k8s.io/v1/storageclasses",
        )
        .body(
            JSON,
            json!({"metadata": {"name": "sc-bad"}, "provisioner": "p", "reclaimPolicy": "Recycle"}),
        )
            .answers(422, "Invalid", "StorageClass.storage.k8s.io \"sc-bad\" is invalid: reclaimPolicy: Unsupported value: \"Recycle\": supported values: \"Delete\", \"Retain\""),
        // --- finalizers and deletion ---
        probe("a finalizer on the claim", "PATCH", "/api/v1/namespaces/probe/persistentvolumeclaims/claim-a")
            .body(MERGE, json!({"metadata": {"finalizers": ["kubernetes.io/pvc-protection", "example.com/hold"]}})),
        probe("delete the held claim", "DELETE", "/api/v1/namespaces/probe/persistentvolumeclaims/claim-a"),
        probe("delete the held claim again", "DELETE", "/api/v1/namespaces/probe/persistentvolumeclaims/claim-a"),
        probe(
            "a new finalizer on a deleted claim",
            "PATCH",
            "/api/v1/namespaces/probe/persistentvolumeclaims/claim-a",
        )
        .body(
            JSON_PATCH,
            json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/late"}]),
        )
            .answers(422, "Invalid", "PersistentVolumeClaim \"claim-a\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"example.com/late\"}"),
        probe(
            "delete with a UID precondition that does not hold",
            "DELETE",
            "/api/v1/persistentvolumes/pv-a",
        )
        .body(
            JSON,
            json!({"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}}),
        )
            .answers(409, "Conflict", "Operation cannot be fulfilled on PersistentVolume \"pv-a\": the UID in the precondition (<uid>) does not match the UID in record (<uid>). The object might have been deleted and then recreated"),
        // --- status and deletion answers ---
        probe("status sent to the main resource", "PATCH", "/api/v1/persistentvolumes/pv-a")
            .body(MERGE, json!({"status": {"phase": "Failed"}, "metadata": {"labels": {"x": "y"}}})),
        probe(
            "spec sent to the status subresource",
            "PATCH",
            "/api/v1/persistentvolumes/pv-a/status",
        )
        .body(MERGE, json!({"spec": {"persistentVolumeReclaimPolicy": "Delete"}})),
        probe("delete a StorageClass", "DELETE", "/apis/storage.k8s.io/v1/storageclasses/sc-a")
            .fields(&[("/kind", json!("StorageClass"))]),
        probe("create an unscheduled pod", "POST", "/api/v1/namespaces/default/pods").body(
            JSON,
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        )
            .answers(201, "", ""),
        probe("delete the unscheduled pod", "DELETE", "/api/v1/namespaces/default/pods/p")
            .fields(&[("/kind", json!("Pod"))]),
        probe(
            "a core Event without involvedObject.namespace",
            "POST",
            "/api/v1/namespaces/probe/events",
        )
        .body(
            JSON,
            json!({"metadata": {"name": "e1"}, "involvedObject": {"kind": "PersistentVolume", "name": "pv-a"}, "reason": "R", "message": "m", "type": "Normal"}),
        )
            .answers(422, "Invalid", "Event \"e1\" is invalid: involvedObject.namespace: Invalid value: \"\": does not match event.namespace"),
        probe(
            "a core Event named with 260 characters",
            "POST",
            "/api/v1/namespaces/probe/events",
        )
        .body(
            JSON,
            json!({"metadata": {"name": "e".repeat(260)}, "involvedObject": {"kind": "PersistentVolumeClaim", "namespace": "probe", "name": "claim-a"}, "reason": "R", "message": "m", "type": "Normal"}),
        )
            .answers(201, "", ""),
        probe(
            "an events.k8s.io/v1 Event named with 260 characters",
            "POST",
            "/apis/events.k8s.io/v1/namespaces/probe/events",
        )
        .body(
            JSON,
            json!({"metadata": {"name": "f".repeat(260)}, "regarding": {"kind": "PersistentVolumeClaim", "namespace": "probe", "name": "claim-a"}, "reason": "R", "note": "m", "type": "Normal", "action": "A", "reportingController": "c", "reportingInstance": "i", "eventTime": "2026-01-01T00:00:00.000000Z"}),
        )
            .answers(422, "Invalid", "Event \"ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff\" is invalid: metadata.name: Invalid value: \"ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff\": must be no more than 253 characters"),
        probe("list PVs a page at a time", "GET", "/api/v1/persistentvolumes?limit=1"),
        // --- what a delete answers: the object, or a Status ---
        probe("create a Secret", "POST", "/api/v1/namespaces/probe/secrets")
            .body(JSON, json!({"metadata": {"name": "s"}}))
            .answers(201, "", ""),
        probe("delete the Secret", "DELETE", "/api/v1/namespaces/probe/secrets/s")
            .fields(&[("/kind", json!("Status"))]),
        probe("create a Lease", "POST", "/apis/coordination.k8s.io/v1/namespaces/probe/leases")
            .body(JSON, json!({"metadata": {"name": "l"}}))
            .answers(201, "", ""),
        probe("delete the Lease", "DELETE", "/apis/coordination.k8s.io/v1/namespaces/probe/leases/l")
            .fields(&[("/kind", json!("Status"))]),
        probe("create a Node", "POST", "/api/v1/nodes").body(JSON, json!({"metadata": {"name": "n"}}))
            .answers(201, "", ""),
        probe("create a CSINode", "POST", "/apis/storage.k8s.io/v1/csinodes")
            .body(JSON, json!({"metadata": {"name": "n"}, "spec": {"drivers": []}}))
            .answers(201, "", ""),
        probe("delete the CSINode", "DELETE", "/apis/storage.k8s.io/v1/csinodes/n")
            .fields(&[("/kind", json!("CSINode"))]),
        probe("delete the Node", "DELETE", "/api/v1/nodes/n")
            .fields(&[("/kind", json!("Status"))]),
        probe("create a claim to delete", "POST", "/api/v1/namespaces/probe/persistentvolumeclaims")
            .body(JSON, pvc("claim-d"))
            .answers(201, "", ""),
        probe(
            "drop its protection",
            "PATCH",
            "/api/v1/namespaces/probe/persistentvolumeclaims/claim-d",
        )
        .body(MERGE, json!({"metadata": {"finalizers": null}})),
        probe(
            "delete the unprotected claim",
            "DELETE",
            "/api/v1/namespaces/probe/persistentvolumeclaims/claim-d",
        ),
        probe("create a PV to delete", "POST", "/api/v1/persistentvolumes").body(JSON, pv("pv-d"))
            .answers(201, "", ""),
        probe("drop the PV's protection", "PATCH", "/api/v1/persistentvolumes/pv-d")
            .body(MERGE, json!({"metadata": {"finalizers": null}})),
        probe("delete the unprotected PV", "DELETE", "/api/v1/persistentvolumes/pv-d")
            .fields(&[("/kind", json!("PersistentVolume"))]),
        probe("delete the 260-character Event", "DELETE", "/api/v1/namespaces/probe/events/eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee")
            .fields(&[("/kind", json!("Status"))]),
        probe(
            "delete with a resourceVersion precondition that does not hold",
            "DELETE",
            "/api/v1/persistentvolumes/pv-a",
        )
        .body(JSON, json!({"preconditions": {"resourceVersion": "1"}}))
            .answers(409, "Conflict", "Operation cannot be fulfilled on PersistentVolume \"pv-a\": the ResourceVersion in the precondition (<n>) does not match the ResourceVersion in record (<n>). The object might have been modified"),
        probe("update (PUT) with a UID that does not match", "PUT", "/api/v1/persistentvolumes/pv-a")
            .body(
                JSON,
                json!({"metadata": {"name": "pv-a", "uid": "00000000-0000-0000-0000-000000000000"}, "spec": pv("pv-a")["spec"]}),
            )
            .answers(
                409,
                "Conflict",
                "Operation cannot be fulfilled on persistentvolumes \"pv-a\": StorageError: invalid object, Code: 4, Key: /registry/persistentvolumes/pv-a, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: <uid>, UID in object meta: <uid>",
            ),
        probe(
            "update with a UID that does not match",
            "PATCH",
            "/api/v1/persistentvolumes/pv-a",
        )
        .body(MERGE, json!({"metadata": {"uid": "00000000-0000-0000-0000-000000000000"}}))
            .answers(422, "Invalid", "PersistentVolume \"pv-a\" is invalid: metadata.uid: Invalid value: \"<uid>\": field is immutable"),
        probe(
            "list PVs with an unsupported field selector",
            "GET",
            "/api/v1/persistentvolumes?fieldSelector=spec.csi.driver%3Dx",
        )
            .answers(400, "BadRequest", "\"spec.csi.driver\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""),
        probe(
            "list PVs by status.phase",
            "GET",
            "/api/v1/persistentvolumes?fieldSelector=status.phase%3DBound",
        )
            .answers(400, "BadRequest", "\"status.phase\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""),
        probe(
            "list claims by status.phase",
            "GET",
            "/api/v1/persistentvolumeclaims?fieldSelector=status.phase%3DBound",
        )
            .answers(400, "BadRequest", "\"status.phase\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""),
        probe(
            "list Secrets with an unsupported field selector",
            "GET",
            "/api/v1/secrets?fieldSelector=spec.x%3Dx",
        )
            .answers(400, "BadRequest", "field label not supported: spec.x"),
        // --- list and watch options ---
        probe(
            "list with resourceVersionMatch but no resourceVersion",
            "GET",
            "/api/v1/persistentvolumes?resourceVersionMatch=NotOlderThan",
        )
        .answers(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        probe(
            "list with resourceVersionMatch=Exact and resourceVersion=0",
            "GET",
            "/api/v1/persistentvolumes?resourceVersionMatch=Exact&resourceVersion=0",
        )
        .answers(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ),
        probe(
            "list with an unknown resourceVersionMatch",
            "GET",
            "/api/v1/persistentvolumes?resourceVersionMatch=Newest&resourceVersion=1",
        )
        .answers(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"Newest\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
        ),
        probe(
            "list with a bad continue token",
            "GET",
            "/api/v1/persistentvolumes?limit=1&continue=abc",
        )
        .answers(
            400,
            "BadRequest",
            "invalid continue token: continue key is not valid: invalid character 'i' looking for beginning of value",
        )
        .sim_differs(
            "the JSON decoder's own words (Go's encoding/json, serde_json)",
            400,
            "BadRequest",
            "invalid continue token: continue key is not valid: expected value at line 1 column 1",
        ),
        probe(
            "list with an unsupported field selector",
            "GET",
            "/api/v1/persistentvolumeclaims?fieldSelector=spec.volumeName%3Dx",
        )
        .answers(
            400,
            "BadRequest",
            "\"spec.volumeName\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
        ),
        probe(
            "list with a bad label selector",
            "GET",
            "/api/v1/persistentvolumes?labelSelector=a%20in",
        )
        .answers(
            400,
            "BadRequest",
            "unable to parse requirement: found '' expected: '('",
        )
        .sim_differs(
            "the selector parser's own words (the code and reason agree)",
            400,
            "BadRequest",
            "unable to parse requirement: invalid label selector \"a in\"",
        ),
        probe(
            "watch with resourceVersionMatch",
            "GET",
            "/api/v1/persistentvolumes?watch=true&resourceVersionMatch=NotOlderThan&resourceVersion=0&timeoutSeconds=1",
        )
        .answers(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch",
        )
        .sim_differs(
            "version: 1.27+ allow it with sendInitialEvents and word the refusal so",
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ),
        probe(
            "a streaming list (sendInitialEvents)",
            "GET",
            "/api/v1/persistentvolumes?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
        )
        .answers(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch, resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided]",
        )
        .sim_differs(
            "version: streaming lists (WatchList) are served by 1.32+ and by kube-sim (SimConfig::watch_list)",
            200,
            "",
            "",
        ),
        probe(
            "list from a resourceVersion the server has not reached",
            "GET",
            "/api/v1/persistentvolumes?resourceVersion=999999999",
        )
        .answers(
            504,
            "Timeout",
            "Timeout: Too large resource version: 999999999, current: <n>",
        ),
        probe(
            "watch from a resourceVersion the server has not reached",
            "GET",
            "/api/v1/persistentvolumes?watch=true&resourceVersion=999999999&timeoutSeconds=5",
        ),
    ]
}

/// A message as probes compare it: its first line (kube-apiserver appends Go-rendered diffs),
/// every UUID as `<uid>`, numbers in parentheses as `(<n>)` and any other number of two digits
/// or more as `<n>` (resourceVersions differ from run to run).
fn normalized(s: &str) -> String {
    let first = s.lines().next().unwrap_or("");
    let mut out = String::new();
    let b = first.as_bytes();
    let mut i = 0;
    while i < first.len() {
        let is_uuid = b.len() >= i + 36
            && b[i..i + 36].iter().enumerate().all(|(j, c)| match j {
                8 | 13 | 18 | 23 => *c == b'-',
                _ => c.is_ascii_hexdigit(),
            });
        let digits = b[i..]
            .iter()
            .skip(1)
            .take_while(|c| c.is_ascii_digit())
            .count();
        let run = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        let word_start = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if is_uuid {
            out.push_str("<uid>");
            i += 36;
        } else if b[i] == b'(' && digits > 0 && b.get(i + 1 + digits) == Some(&b')') {
            out.push_str("(<n>)");
            i += digits + 2;
        } else if word_start && run >= 2 {
            // resourceVersions ("current: 338"); both sides are normalised alike.
            out.push_str("<n>");
            i += run;
        } else {
            let c = first[i..].chars().next().expect("in bounds");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// What a server answered: code, reason, message, and the answer itself.
#[derive(Debug)]
struct Answer {
    code: u16,
    reason: String,
    message: String,
    body: Value,
}

async fn send(client: &Client, p: &Probe) -> Answer {
    let body = p
        .body
        .as_ref()
        .map(|b| serde_json::to_vec(b).expect("body"))
        .unwrap_or_default();
    let req = Request::builder()
        .method(p.method)
        .uri(p.path)
        .header("Content-Type", p.content_type)
        .header("Accept", "application/json")
        .body(Body::from(body))
        .expect("request");
    let resp = client
        .send(req)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", p.what));
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect_bytes().await.expect("answer body");
    // A watch answers a stream of events; its first line is what a probe compares.
    let first = bytes.split(|c| *c == b'\n').next().unwrap_or_default();
    let body: Value = serde_json::from_slice(first).unwrap_or(Value::Null);
    let status = match body.get("type") {
        Some(_) => body.get("object").cloned().unwrap_or(Value::Null),
        None => body.clone(),
    };
    let failed = status.get("kind").and_then(Value::as_str) == Some("Status")
        && status.get("status").and_then(Value::as_str) == Some("Failure");
    let text = |k: &str| {
        status
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    Answer {
        code,
        reason: if failed {
            text("reason")
        } else {
            String::new()
        },
        message: if failed {
            normalized(&text("message"))
        } else {
            String::new()
        },
        body,
    }
}

/// Runs every probe against `client` and returns a line per mismatch with the expectation.
async fn check(world: &str, client: &Client, sim: bool) -> Vec<String> {
    let mut bad = Vec::new();
    for p in probes() {
        let got = send(client, &p).await;
        if std::env::var_os("PROBE_DUMP").is_some() {
            eprintln!(
                "{world} | {} | {} {:?} {:?}\n    {}",
                p.what, got.code, got.reason, got.message, got.body
            );
        }
        let (code, reason, message) = match (&p.sim, sim) {
            (Some(s), true) => (s.code, s.reason, s.message),
            _ => (p.code, p.reason, p.message),
        };
        let message = normalized(message);
        if got.code != code || got.reason != reason || got.message != message {
            let on_purpose = match (&p.sim, sim) {
                (Some(s), true) => format!(" (kube-sim differs on purpose: {})", s.why),
                _ => String::new(),
            };
            bad.push(format!(
                "{world}: {}: got {} {:?} {:?}, want {code} {reason:?} {message:?}{on_purpose}",
                p.what, got.code, got.reason, got.message
            ));
            continue;
        }
        for (ptr, want) in &p.fields {
            let have = got.body.pointer(ptr).cloned().unwrap_or(Value::Null);
            if have != *want {
                bad.push(format!("{world}: {}: {ptr} is {have}, want {want}", p.what));
            }
        }
    }
    bad
}

/// A client of `kubeconfig` that never retries by itself: a 504 or 429 is an answer to compare.
async fn client_without_retries(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    config.default_retry = false;
    Client::try_from(config).expect("client")
}

#[tokio::test]
async fn kube_sim_answers_as_the_real_api_server() {
    let sim = Sim::start(SimConfig::default())
        .await
        .expect("start kube-sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("write kubeconfig");
    let mut bad = check("kube-sim", &client_without_retries(&kubeconfig).await, true).await;
    match RealCluster::start().await {
        Some(real) => {
            let client = client_without_retries(&real.kubeconfig).await;
            bad.extend(check("kube-apiserver 1.20", &client, false).await)
        }
        None => eprintln!("only kube-sim checked"),
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
