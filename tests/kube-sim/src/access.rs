//! SelfSubjectAccessReview and SelfSubjectRulesReview: the simulator has no authorizer, so a
//! review is answered from the fault rules. A standing 403 rule (no `count`, no `rate`) on a verb and resource is how a test
//! says "this identity lacks that permission": the requests themselves are refused by the rule, and
//! a review of the same verb and resource answers `allowed: false`, as a real RBAC denial would.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::faults::Faults;

/// The answered review: the request's spec echoed, with its status.
pub(crate) fn review(faults: &Faults, mut body: Value) -> Result<Value, ApiError> {
    let attrs = body
        .pointer("/spec/resourceAttributes")
        .cloned()
        .unwrap_or(Value::Null);
    if !attrs.is_object() && body.pointer("/spec/nonResourceAttributes").is_none() {
        return Err(ApiError::bad_request(
            "SelfSubjectAccessReview: exactly one of spec.resourceAttributes or spec.nonResourceAttributes is required",
        ));
    }
    let text = |k: &str| attrs.get(k).and_then(Value::as_str).unwrap_or_default();
    let resource = match text("subresource") {
        "" => text("resource").to_string(),
        sub => format!("{}/{sub}", text("resource")),
    };
    let status = match faults.denial(text("verb"), &resource, text("name")) {
        Some(reason) => json!({"allowed": false, "denied": true, "reason": reason}),
        None => {
            json!({"allowed": true, "reason": "kube-sim allows every request no standing 403 rule refuses"})
        }
    };
    body["status"] = status;
    body["apiVersion"] = json!("authorization.k8s.io/v1");
    body["kind"] = json!("SelfSubjectAccessReview");
    Ok(body)
}

/// The answered rules review. Without standing 403 rules everything is allowed (one wildcard
/// rule). With them the rules are reported `incomplete` and empty, as an authorizer that cannot
/// list its rules (a webhook) does: the client must ask with access reviews, which know the
/// denials.
pub(crate) fn rules_review(faults: &Faults, mut body: Value) -> Result<Value, ApiError> {
    let namespace = body
        .pointer("/spec/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if namespace.is_empty() {
        return Err(ApiError::bad_request(
            "SelfSubjectRulesReview: spec.namespace: Required value: no namespace on request",
        ));
    }
    body["status"] = if faults.has_denials() {
        json!({
            "resourceRules": [],
            "nonResourceRules": [],
            "incomplete": true,
            "evaluationError": "kube-sim lists no rules while a standing 403 rule denies something",
        })
    } else {
        json!({
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            "incomplete": false,
        })
    };
    body["apiVersion"] = json!("authorization.k8s.io/v1");
    body["kind"] = json!("SelfSubjectRulesReview");
    Ok(body)
}
