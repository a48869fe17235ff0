//! Request counters by (verb, resource, response code), so benchmarks can report API calls.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

/// (verb, resource, code) -> requests.
type Table = BTreeMap<(String, String, u16), u64>;

#[derive(Clone, Default)]
pub(crate) struct Live(Arc<Mutex<Table>>);

impl Live {
    pub fn record(&self, verb: &str, resource: &str, code: u16) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((verb.to_string(), resource.to_string(), code))
            .or_default() += 1;
    }
    pub fn snapshot(&self) -> Counters {
        Counters(self.0.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
    pub fn reset(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// A snapshot of request counts. Resources are plurals, with `/status` for the subresource
/// (`persistentvolumes/status`); verbs are the Kubernetes verbs (get, list, watch, create,
/// update, patch, delete, deletecollection).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters(Table);

/// One row of [`Counters::rows`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CounterRow {
    pub verb: String,
    pub resource: String,
    pub code: u16,
    pub count: u64,
}

fn res_match(filter: Option<&str>, resource: &str) -> bool {
    filter.is_none_or(|f| {
        f == resource || (!f.contains('/') && resource.split('/').next() == Some(f))
    })
}

impl Counters {
    /// Requests with exactly this verb, resource and code.
    pub fn get(&self, verb: &str, resource: &str, code: u16) -> u64 {
        self.0
            .get(&(verb.to_string(), resource.to_string(), code))
            .copied()
            .unwrap_or(0)
    }
    /// Requests matching the filters (None = any). A plural resource also counts its `/status`.
    pub fn count(&self, verb: Option<&str>, resource: Option<&str>, code: Option<u16>) -> u64 {
        self.0
            .iter()
            .filter(|((v, r, c), _)| {
                verb.is_none_or(|x| x == v)
                    && res_match(resource, r)
                    && code.is_none_or(|x| x == *c)
            })
            .map(|(_, n)| n)
            .sum()
    }
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
    /// All write requests (create, update, patch, delete, deletecollection), any resource and code.
    pub fn writes(&self) -> u64 {
        self.writes_to(None)
    }
    /// Write requests to one resource (including its `/status`), or to all with `None`.
    pub fn writes_to(&self, resource: Option<&str>) -> u64 {
        let writes: u64 = WRITE_VERBS
            .iter()
            .map(|v| self.count(Some(v), resource, None))
            .sum();
        // A SelfSubjectAccessReview is a POST that is answered, never stored: not a write.
        match resource {
            None => writes - self.count(Some("create"), Some(crate::resources::SSAR), None),
            Some(_) => writes,
        }
    }
    /// Difference `self - earlier`, for counting what one phase of a test did.
    pub fn since(&self, earlier: &Counters) -> Counters {
        let mut m = self.0.clone();
        for (k, n) in m.iter_mut() {
            *n = n.saturating_sub(earlier.0.get(k).copied().unwrap_or(0));
        }
        m.retain(|_, n| *n > 0);
        Counters(m)
    }
    pub fn rows(&self) -> Vec<CounterRow> {
        self.0
            .iter()
            .map(|((verb, resource, code), count)| CounterRow {
                verb: verb.clone(),
                resource: resource.clone(),
                code: *code,
                count: *count,
            })
            .collect()
    }
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"total": self.total(), "writes": self.writes(), "requests": self.rows()})
    }
}
