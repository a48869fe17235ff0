//! Injected faults: latency and error answers (500, 503, 429 with Retry-After, 409, ...) by
//! verb, resource and name, with a rate or a count.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::ApiError;

/// One fault rule. Unset matchers match anything. JSON field names are the admin API's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultRule {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verb: Option<String>,
    /// Plural resource name; `persistentvolumes` also matches `persistentvolumes/status`
    /// unless the rule names the subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// Object name (for verbs that address one object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// HTTP status to answer with instead of serving the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Delay before the request is served (or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// Retry-After for 429/503 answers (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// Probability in [0, 1] that a matching request is hit (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// Number of hits after which the rule stops applying (default unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Message of the error Status (a default per status code otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl FaultRule {
    /// Answer matching requests with `status`.
    pub fn error(status: u16) -> Self {
        Self {
            status: Some(status),
            ..Self::default()
        }
    }
    /// Delay matching requests.
    pub fn latency(d: Duration) -> Self {
        Self {
            latency_ms: Some(d.as_millis() as u64),
            ..Self::default()
        }
    }
    pub fn verb(mut self, verb: &str) -> Self {
        self.verb = Some(verb.to_string());
        self
    }
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_string());
        self
    }
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }
    pub fn times(mut self, n: u64) -> Self {
        self.count = Some(n);
        self
    }
    pub fn rate(mut self, p: f64) -> Self {
        self.rate = Some(p);
        self
    }
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_seconds = Some(secs);
        self
    }
    pub fn with_latency(mut self, d: Duration) -> Self {
        self.latency_ms = Some(d.as_millis() as u64);
        self
    }
    pub fn message(mut self, m: &str) -> Self {
        self.message = Some(m.to_string());
        self
    }

    fn matches(&self, verb: &str, resource: &str, name: &str) -> bool {
        let res_ok = self.resource.as_deref().is_none_or(|r| {
            r == resource || (!r.contains('/') && resource.split('/').next() == Some(r))
        });
        self.verb.as_deref().is_none_or(|v| v == verb)
            && res_ok
            && self.name.as_deref().is_none_or(|n| n == name)
    }
}

/// A rule as listed by [`Faults::list`], with how often it fired.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultEntry {
    pub id: u64,
    pub rule: FaultRule,
    pub hits: u64,
}

#[derive(Default)]
struct State {
    next_id: u64,
    rules: Vec<FaultEntry>,
}

/// Handle to the simulator's fault rules (cheap to clone).
#[derive(Clone, Default)]
pub struct Faults(Arc<Mutex<State>>);

/// What the faults say about one request.
#[derive(Debug, Default)]
pub struct Decision {
    pub latency: Duration,
    pub error: Option<ApiError>,
}

impl Faults {
    /// Adds a rule; returns its id for [`Faults::remove`].
    pub fn add(&self, rule: FaultRule) -> u64 {
        let mut s = self.lock();
        s.next_id += 1;
        let id = s.next_id;
        s.rules.push(FaultEntry { id, rule, hits: 0 });
        id
    }
    pub fn remove(&self, id: u64) -> bool {
        let mut s = self.lock();
        let before = s.rules.len();
        s.rules.retain(|r| r.id != id);
        s.rules.len() != before
    }
    pub fn clear(&self) {
        self.lock().rules.clear();
    }
    pub fn list(&self) -> Vec<FaultEntry> {
        self.lock().rules.clone()
    }
    /// Hits of rule `id` so far (0 if unknown).
    pub fn hits(&self, id: u64) -> u64 {
        self.lock()
            .rules
            .iter()
            .find(|r| r.id == id)
            .map_or(0, |r| r.hits)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether any standing 403 rule exists (see [`Faults::denial`]).
    pub(crate) fn has_denials(&self) -> bool {
        self.lock()
            .rules
            .iter()
            .any(|e| e.rule.status == Some(403) && e.rule.count.is_none() && e.rule.rate.is_none())
    }

    /// The message of a standing 403 rule (no `count`, no `rate`) matching the request, if any:
    /// what a SelfSubjectAccessReview of it answers as the reason of a denial.
    pub(crate) fn denial(&self, verb: &str, resource: &str, name: &str) -> Option<String> {
        self.lock()
            .rules
            .iter()
            .map(|e| &e.rule)
            .find(|r| {
                r.status == Some(403)
                    && r.count.is_none()
                    && r.rate.is_none()
                    && r.matches(verb, resource, name)
            })
            .map(|r| {
                r.message
                    .clone()
                    .unwrap_or_else(|| format!("kube-sim denies {verb} on {resource}"))
            })
    }

    pub(crate) fn decide(
        &self,
        verb: &str,
        resource: &str,
        plural: &str,
        qualified: &str,
        name: &str,
    ) -> Decision {
        use rand::Rng;
        let mut d = Decision::default();
        let mut s = self.lock();
        let mut rng = rand::rng();
        for e in s.rules.iter_mut() {
            if !e.rule.matches(verb, resource, name) {
                continue;
            }
            if e.rule.count.is_some_and(|c| e.hits >= c) {
                continue;
            }
            if let Some(p) = e.rule.rate
                && rng.random::<f64>() >= p
            {
                continue;
            }
            e.hits += 1;
            d.latency += Duration::from_millis(e.rule.latency_ms.unwrap_or(0));
            if d.error.is_none()
                && let Some(code) = e.rule.status
            {
                d.error = Some(fault_error(&e.rule, code, plural, qualified, name));
            }
        }
        d
    }
}

fn fault_error(rule: &FaultRule, code: u16, plural: &str, qualified: &str, name: &str) -> ApiError {
    let msg = rule.message.clone();
    let mut e = match code {
        409 => ApiError::new(
            409,
            "Conflict",
            msg.unwrap_or_else(|| format!("Operation cannot be fulfilled on {qualified} {name:?}: the object has been modified; please apply your changes to the latest version and try again")),
        ),
        429 => ApiError::new(429, "TooManyRequests", msg.unwrap_or_else(|| "Too many requests, please try again later.".into())),
        503 => ApiError::new(503, "ServiceUnavailable", msg.unwrap_or_else(|| "the server is currently unable to handle the request".into())),
        504 => ApiError::new(504, "Timeout", msg.unwrap_or_else(|| "Timeout: request did not complete within requested timeout".into())),
        404 => ApiError::new(404, "NotFound", msg.unwrap_or_else(|| format!("{qualified} {name:?} not found"))),
        500 => ApiError::internal(&msg.unwrap_or_else(|| "injected fault".into())),
        // The reasons the real server pairs with these codes (clients classify by reason first).
        c => {
            let reason = match c {
                401 => "Unauthorized",
                403 => "Forbidden",
                405 => "MethodNotAllowed",
                410 => "Gone",
                422 => "Invalid",
                c if c >= 500 => "InternalError",
                _ => "BadRequest",
            };
            ApiError::new(c, reason, msg.unwrap_or_else(|| "injected fault".into()))
        }
    };
    if code == 429 || code == 503 {
        let secs = rule.retry_after_seconds.unwrap_or(1);
        e.retry_after = Some(secs);
        e.details = json!({"name": name, "kind": plural, "retryAfterSeconds": secs});
    } else if code == 409 || code == 404 {
        e.details = json!({"name": name, "kind": plural});
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injected_errors_carry_the_reason_the_real_server_pairs_with_their_code() {
        let rule = FaultRule::error(0);
        let reason =
            |code| fault_error(&rule, code, "persistentvolumes", "persistentvolumes", "a").reason;
        assert_eq!(reason(403), "Forbidden");
        assert_eq!(reason(401), "Unauthorized");
        assert_eq!(reason(422), "Invalid");
        assert_eq!(reason(409), "Conflict");
        assert_eq!(reason(500), "InternalError");
        assert_eq!(reason(502), "InternalError");
        assert_eq!(reason(400), "BadRequest");
    }

    #[test]
    fn count_limits_hits_and_status_subresource_matches_plural() {
        let f = Faults::default();
        let id = f.add(
            FaultRule::error(503)
                .verb("update")
                .resource("persistentvolumes")
                .times(1),
        );
        assert!(
            f.decide(
                "get",
                "persistentvolumes",
                "persistentvolumes",
                "persistentvolumes",
                "a"
            )
            .error
            .is_none()
        );
        let d = f.decide(
            "update",
            "persistentvolumes/status",
            "persistentvolumes",
            "persistentvolumes",
            "a",
        );
        assert_eq!(d.error.unwrap().code, 503);
        assert!(
            f.decide(
                "update",
                "persistentvolumes",
                "persistentvolumes",
                "persistentvolumes",
                "a"
            )
            .error
            .is_none()
        );
        assert_eq!(f.hits(id), 1);
    }
}
