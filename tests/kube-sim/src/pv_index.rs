//! An index of PersistentVolumes by the claim they name (and those naming none), fed by the
//! change feed, so controller syncs do not scan every PV.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use crate::ops::meta_str;
use crate::resources::PV;
use crate::store::{EventType, Record, Store};

/// (namespace, name).
pub(crate) type NsName = (String, String);

/// The (namespace, name) a PV's `spec.claimRef` names.
pub(crate) fn claim_ref(pv: &Value) -> Option<NsName> {
    pv.pointer("/spec/claimRef")
        .filter(|c| c.is_object())
        .map(|c| {
            (
                str_at(c, "/namespace").to_string(),
                str_at(c, "/name").to_string(),
            )
        })
}

fn str_at<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Which PVs name which claim, and which name none, kept from the change feed so that
/// syncs do not scan every PV. Candidates are re-read from the store before use.
#[derive(Default)]
pub(crate) struct PvIndex {
    by_claim: HashMap<NsName, BTreeSet<String>>,
    pub(crate) unclaimed: BTreeSet<String>,
}

impl PvIndex {
    fn forget(&mut self, name: &str, pv: &Value) {
        match claim_ref(pv) {
            Some(c) => {
                if let Some(set) = self.by_claim.get_mut(&c) {
                    set.remove(name);
                    if set.is_empty() {
                        self.by_claim.remove(&c);
                    }
                }
            }
            None => {
                self.unclaimed.remove(name);
            }
        }
    }

    fn insert(&mut self, name: &str, pv: &Value) {
        match claim_ref(pv) {
            Some(c) => {
                self.by_claim.entry(c).or_default().insert(name.to_string());
            }
            None => {
                self.unclaimed.insert(name.to_string());
            }
        }
    }

    pub(crate) fn observe(&mut self, r: &Record) {
        if r.storage != PV {
            return;
        }
        let name = meta_str(&r.obj, "name").to_string();
        if let Some(prev) = r.prev.as_deref() {
            self.forget(&name, prev);
        }
        if r.kind != EventType::Deleted {
            self.insert(&name, &r.obj);
        }
    }

    pub(crate) fn rebuild(&mut self, st: &Store) {
        *self = Self::default();
        for pv in st.list(PV, None) {
            self.insert(meta_str(&pv, "name"), &pv);
        }
    }

    pub(crate) fn claiming(&self, claim: &NsName) -> Vec<String> {
        self.by_claim
            .get(claim)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}
