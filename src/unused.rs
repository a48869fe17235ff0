//! Unused-claim tracking (`--track-unused-claims`, ours): keeps on each claim of our driver the
//! time the last Pod using it went away (`csi-provisioner.rs/unused-since`), cleared when a Pod
//! uses it again, written only on those transitions. Where Kubernetes keeps the claim's `Unused`
//! condition itself (KEP-5541), that is read and nothing is written. Never deletes anything.
//!
//! Cheap on clusters with 100,000 Pods: Pods are decoded into [`PodLite`] (name, namespace, UID,
//! phase, claim names; everything else is skipped while parsing) and only Pods that use a
//! claim are remembered, as claim keys. This module is pure: the projection, the usage index and
//! the transition decision; [`controller`] is the shell.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, HashSet};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

use crate::model::meta::annotation;
use crate::names;

pub(crate) mod controller;

/// A Pod as far as claim usage goes.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct PodLite {
    #[serde(deserialize_with = "lite_meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: PodSpecLite,
    #[serde(default)]
    status: PodStatusLite,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpecLite {
    #[serde(default)]
    volumes: Vec<VolumeLite>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct PodStatusLite {
    #[serde(default)]
    phase: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeLite {
    #[serde(default)]
    name: String,
    #[serde(default)]
    persistent_volume_claim: Option<ClaimSource>,
    /// Generic ephemeral volume: its claim is `<pod>-<volume>`.
    #[serde(default)]
    ephemeral: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimSource {
    claim_name: String,
}

/// Only the identity of the Pod's metadata (no labels, annotations or managed fields).
fn lite_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Lite {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
    }
    let lite = Lite::deserialize(d)?;
    Ok(ObjectMeta {
        name: lite.name,
        namespace: lite.namespace,
        uid: lite.uid,
        resource_version: lite.resource_version,
        ..ObjectMeta::default()
    })
}

impl kube::Resource for PodLite {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl PodLite {
    /// `namespace/name`.
    pub(crate) fn key(&self) -> String {
        key(
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default(),
        )
    }

    /// The claims (`namespace/name`) the Pod uses; none once it has terminated (a finished Pod
    /// uses nothing, as for KEP-5541).
    pub(crate) fn claims(&self) -> Vec<String> {
        if matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return Vec::new();
        }
        let ns = self.metadata.namespace.as_deref().unwrap_or_default();
        let pod = self.metadata.name.as_deref().unwrap_or_default();
        let mut claims: Vec<String> = self
            .spec
            .volumes
            .iter()
            .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
                (Some(c), _) => Some(key(ns, &c.claim_name)),
                (None, Some(_)) => Some(key(ns, &format!("{pod}-{}", v.name))),
                (None, None) => None,
            })
            .collect();
        claims.sort_unstable();
        claims.dedup();
        claims
    }
}

/// `namespace/name`.
pub(crate) fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Which claims are in use: per Pod the claims it uses (Pods using none are not kept), per
/// claim how many Pods use it.
#[derive(Debug, Default)]
pub(crate) struct Usage {
    pods: HashMap<String, Vec<String>>,
    users: HashMap<String, u32>,
}

impl Usage {
    /// Whether a Pod uses the claim `namespace/name`.
    pub(crate) fn is_used(&self, claim: &str) -> bool {
        self.users.get(claim).is_some_and(|n| *n > 0)
    }

    /// The Pod `pod` now uses `claims`; returns the claims whose usage flipped.
    pub(crate) fn set(&mut self, pod: &str, claims: Vec<String>) -> Vec<String> {
        let old = if claims.is_empty() {
            self.pods.remove(pod)
        } else {
            self.pods.insert(pod.to_owned(), claims.clone())
        }
        .unwrap_or_default();
        if old == claims {
            return Vec::new();
        }
        let touched: BTreeSet<String> = old.iter().chain(&claims).cloned().collect();
        let before: Vec<bool> = touched.iter().map(|c| self.is_used(c)).collect();
        for claim in &old {
            if let Some(n) = self.users.get_mut(claim) {
                *n -= 1;
                if *n == 0 {
                    self.users.remove(claim);
                }
            }
        }
        for claim in claims {
            *self.users.entry(claim).or_default() += 1;
        }
        touched
            .into_iter()
            .zip(before)
            .filter(|(claim, was)| self.is_used(claim) != *was)
            .map(|(claim, _)| claim)
            .collect()
    }

    /// Replaces everything with a fresh list of Pods (a re-list); returns the claims whose usage
    /// flipped.
    pub(crate) fn replace(
        &mut self,
        pods: impl IntoIterator<Item = (String, Vec<String>)>,
    ) -> Vec<String> {
        let before: HashSet<String> = self.users.keys().cloned().collect();
        *self = Self::default();
        for (pod, claims) in pods {
            self.set(&pod, claims);
        }
        let after: HashSet<String> = self.users.keys().cloned().collect();
        before.symmetric_difference(&after).cloned().collect()
    }

    /// Pods remembered (those using a claim).
    pub(crate) fn pods(&self) -> usize {
        self.pods.len()
    }
}

/// The one write a claim needs, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transition {
    /// Unused from now: set the annotation to this RFC 3339 time.
    Unused(String),
    /// Used again: remove the annotation.
    Used,
}

/// What `claim` needs given whether a Pod uses it. Nothing where Kubernetes keeps the `Unused`
/// condition, for claims of other drivers, and for claims being deleted.
pub(crate) fn transition(
    claim: &PersistentVolumeClaim,
    driver: &str,
    used: bool,
    now: jiff::Timestamp,
) -> Option<Transition> {
    if !crate::model::claim::is_ours(claim, driver) || claim.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let kept_by_kubernetes = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == names::CONDITION_UNUSED));
    if kept_by_kubernetes {
        return None;
    }
    let marked = annotation(&claim.metadata, names::ANN_UNUSED_SINCE).is_some();
    match (used, marked) {
        (true, true) => Some(Transition::Used),
        (false, false) => Some(Transition::Unused(
            now.round(jiff::Unit::Second).unwrap_or(now).to_string(),
        )),
        _ => None,
    }
}

#[cfg(test)]
#[path = "unused_tests.rs"]
mod tests;
