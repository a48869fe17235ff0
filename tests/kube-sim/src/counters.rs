//! Request counters by (verb, resource, response code), and the same per User-Agent, so
//! benchmarks can report the API calls of one client (the provisioner) apart from their own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

/// (verb, resource, code) -> requests.
type Table = BTreeMap<(String, String, u16), u64>;
/// (User-Agent, verb, resource, code) -> requests.
type AgentTable = BTreeMap<(String, String, String, u16), u64>;

/// Longest User-Agent kept; a longer one is cut (client-go's are about 80 characters).
const MAX_AGENT: usize = 200;

#[derive(Clone, Default)]
pub(crate) struct Live(Arc<Mutex<Counters>>);

impl Live {
    /// One answered request; `agent` is the User-Agent header ("" without one).
    pub fn record(&self, agent: &str, verb: &str, resource: &str, code: u16) {
        let mut agent = agent;
        if agent.len() > MAX_AGENT {
            let mut end = MAX_AGENT;
            while !agent.is_char_boundary(end) {
                end -= 1;
            }
            agent = &agent[..end];
        }
        let mut c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *c.all
            .entry((verb.to_string(), resource.to_string(), code))
            .or_default() += 1;
        *c.agents
            .entry((
                agent.to_string(),
                verb.to_string(),
                resource.to_string(),
                code,
            ))
            .or_default() += 1;
    }
    pub fn snapshot(&self) -> Counters {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn reset(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Counters::default();
    }
}

/// A snapshot of request counts. Resources are plurals, with `/status` for the subresource
/// (`persistentvolumes/status`); verbs are the Kubernetes verbs (get, list, watch, create,
/// update, patch, delete, deletecollection). The same requests are also kept per User-Agent
/// ([`Counters::agent`], [`Counters::agent_rows`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    all: Table,
    agents: AgentTable,
}

/// One row of [`Counters::rows`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CounterRow {
    pub verb: String,
    pub resource: String,
    pub code: u16,
    pub count: u64,
}

/// One row of [`Counters::agent_rows`]: requests of one User-Agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentCounterRow {
    pub agent: String,
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
        self.all
            .get(&(verb.to_string(), resource.to_string(), code))
            .copied()
            .unwrap_or(0)
    }
    /// Requests matching the filters (None = any). A plural resource also counts its `/status`.
    pub fn count(&self, verb: Option<&str>, resource: Option<&str>, code: Option<u16>) -> u64 {
        self.all
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
        self.all.values().sum()
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
        // A SelfSubjectAccessReview (or RulesReview) is a POST that is answered, never stored:
        // not a write.
        match resource {
            None => {
                writes
                    - self.count(Some("create"), Some(crate::resources::SSAR), None)
                    - self.count(Some("create"), Some(crate::resources::SSRR), None)
            }
            Some(_) => writes,
        }
    }
    /// Difference `self - earlier`, for counting what one phase of a test did.
    pub fn since(&self, earlier: &Counters) -> Counters {
        fn minus<K: Ord + Clone>(
            now: &BTreeMap<K, u64>,
            earlier: &BTreeMap<K, u64>,
        ) -> BTreeMap<K, u64> {
            let mut m = now.clone();
            for (k, n) in m.iter_mut() {
                *n = n.saturating_sub(earlier.get(k).copied().unwrap_or(0));
            }
            m.retain(|_, n| *n > 0);
            m
        }
        Counters {
            all: minus(&self.all, &earlier.all),
            agents: minus(&self.agents, &earlier.agents),
        }
    }
    /// Only the requests whose User-Agent satisfies `pred` (e.g. all but a benchmark's own).
    pub fn agent(&self, pred: impl Fn(&str) -> bool) -> Counters {
        let agents: AgentTable = self
            .agents
            .iter()
            .filter(|((a, ..), _)| pred(a))
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        let mut all = Table::new();
        for ((_, v, r, c), n) in &agents {
            *all.entry((v.clone(), r.clone(), *c)).or_default() += n;
        }
        Counters { all, agents }
    }
    /// Requests per User-Agent, verb, resource and code.
    pub fn agent_rows(&self) -> Vec<AgentCounterRow> {
        self.agents
            .iter()
            .map(|((agent, verb, resource, code), count)| AgentCounterRow {
                agent: agent.clone(),
                verb: verb.clone(),
                resource: resource.clone(),
                code: *code,
                count: *count,
            })
            .collect()
    }
    pub fn rows(&self) -> Vec<CounterRow> {
        self.all
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
        serde_json::json!({"total": self.total(), "writes": self.writes(), "requests": self.rows(),
                           "byAgent": self.agent_rows()})
    }
}
