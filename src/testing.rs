//! Test-only scenario builders for the Kubernetes objects the controllers read, so a unit test reads
//! like its scenario: `pvc("ns", "c").class("fast").selected_node("n1").deleting().build()`.
//!
//! Every builder starts from a minimal valid object, each method sets one thing and returns the
//! builder, and `build()` (or `.into()`) hands out the k8s-openapi value. Defaults:
//! - a PVC is `Pending`, `ReadWriteOnce`, requests `1Gi`, has UID `uid-<ns>-<name>`, no class;
//! - a StorageClass is provisioned by [`DRIVER`] with no parameters (binding mode unset = Immediate);
//! - a PV is a CSI volume of [`DRIVER`] with handle `handle-<name>`;
//! - a Node has UID `uid-<name>`; a CSINode has no drivers.
//!
//! Extend freely: add a method rather than poking at `.build()` output in a test.

// A toolbox: not every builder is used by every module's tests at any one time.
#![allow(dead_code)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PersistentVolumeSpec, PersistentVolumeStatus, SecretReference,
    TopologySelectorLabelRequirement, TopologySelectorTerm, TypedLocalObjectReference,
    TypedObjectReference, VolumeNodeAffinity, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};

use crate::names;

/// Driver name every builder uses unless told otherwise.
pub(crate) const DRIVER: &str = "mock.csi.test";

/// A fixed deletion timestamp: tests never depend on the wall clock.
pub(crate) fn deletion_time() -> Time {
    Time(jiff::Timestamp::from_second(1_700_000_000).expect("valid timestamp"))
}

fn meta(namespace: Option<&str>, name: &str, uid: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        uid: Some(uid),
        resource_version: Some("1".to_owned()),
        ..ObjectMeta::default()
    }
}

fn strings<I, S>(items: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    items.into_iter().map(Into::into).collect()
}

/// Shared metadata setters (annotations, labels, finalizers, deletion) for every builder.
macro_rules! meta_setters {
    ($builder:ident, $ty:ident) => {
        impl $builder {
            /// Sets `metadata.uid`.
            pub(crate) fn uid(mut self, uid: &str) -> Self {
                self.obj.metadata.uid = Some(uid.to_owned());
                self
            }
            /// Removes `metadata.uid` (a corrupted object).
            pub(crate) fn no_uid(mut self) -> Self {
                self.obj.metadata.uid = None;
                self
            }
            /// Sets `metadata.resourceVersion`.
            pub(crate) fn resource_version(mut self, rv: &str) -> Self {
                self.obj.metadata.resource_version = Some(rv.to_owned());
                self
            }
            /// Adds one annotation.
            pub(crate) fn annotation(mut self, key: &str, value: &str) -> Self {
                self.obj
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key.to_owned(), value.to_owned());
                self
            }
            /// Adds one label.
            pub(crate) fn label(mut self, key: &str, value: &str) -> Self {
                self.obj
                    .metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key.to_owned(), value.to_owned());
                self
            }
            /// Adds one finalizer.
            pub(crate) fn finalizer(mut self, finalizer: &str) -> Self {
                self.obj
                    .metadata
                    .finalizers
                    .get_or_insert_with(Vec::new)
                    .push(finalizer.to_owned());
                self
            }
            /// Sets `metadata.deletionTimestamp` (to [`deletion_time`]).
            pub(crate) fn deleting(mut self) -> Self {
                self.obj.metadata.deletion_timestamp = Some(deletion_time());
                self
            }
            /// Returns the built object.
            pub(crate) fn build(self) -> $ty {
                self.obj
            }
        }
        impl From<$builder> for $ty {
            fn from(builder: $builder) -> Self {
                builder.build()
            }
        }
    };
}

mod cluster;
pub(crate) use cluster::*;

// === PersistentVolumeClaim ===

/// Builder returned by [`pvc`].
#[derive(Clone, Debug)]
pub(crate) struct PvcBuilder {
    obj: PersistentVolumeClaim,
}

/// A pending `ReadWriteOnce` claim of `1Gi` with UID `uid-<ns>-<name>`.
pub(crate) fn pvc(namespace: &str, name: &str) -> PvcBuilder {
    let mut requests = BTreeMap::new();
    requests.insert("storage".to_owned(), Quantity("1Gi".to_owned()));
    PvcBuilder {
        obj: PersistentVolumeClaim {
            metadata: meta(Some(namespace), name, format!("uid-{namespace}-{name}")),
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(requests),
                    limits: None,
                }),
                ..PersistentVolumeClaimSpec::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some("Pending".to_owned()),
                ..PersistentVolumeClaimStatus::default()
            }),
        },
    }
}

meta_setters!(PvcBuilder, PersistentVolumeClaim);

impl PvcBuilder {
    fn spec(&mut self) -> &mut PersistentVolumeClaimSpec {
        self.obj.spec.get_or_insert_with(Default::default)
    }

    /// Sets the GA `volume.kubernetes.io/storage-provisioner` annotation.
    pub(crate) fn provisioner(self, driver: &str) -> Self {
        self.annotation(names::ANN_STORAGE_PROVISIONER, driver)
    }
    /// Sets only the beta `volume.beta.kubernetes.io/storage-provisioner` annotation.
    pub(crate) fn beta_provisioner(self, driver: &str) -> Self {
        self.annotation(names::ANN_BETA_STORAGE_PROVISIONER, driver)
    }
    /// Sets `spec.storageClassName`.
    pub(crate) fn class(mut self, class: &str) -> Self {
        self.spec().storage_class_name = Some(class.to_owned());
        self
    }
    /// Sets the beta `volume.beta.kubernetes.io/storage-class` annotation.
    pub(crate) fn beta_class(self, class: &str) -> Self {
        self.annotation(names::ANN_BETA_STORAGE_CLASS, class)
    }
    /// Sets `resources.requests.storage` (any string, so invalid sizes can be tested).
    pub(crate) fn request(mut self, size: &str) -> Self {
        self.spec()
            .resources
            .get_or_insert_with(Default::default)
            .requests
            .get_or_insert_with(BTreeMap::new)
            .insert("storage".to_owned(), Quantity(size.to_owned()));
        self
    }
    /// Removes `resources.requests.storage`.
    pub(crate) fn no_request(mut self) -> Self {
        if let Some(requests) = self
            .spec()
            .resources
            .as_mut()
            .and_then(|r| r.requests.as_mut())
        {
            requests.remove("storage");
        }
        self
    }
    /// Replaces `spec.accessModes`.
    pub(crate) fn access_modes<I, S>(mut self, modes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.spec().access_modes = Some(strings(modes));
        self
    }
    /// Sets `volume.kubernetes.io/selected-node`.
    pub(crate) fn selected_node(self, node: &str) -> Self {
        self.annotation(names::ANN_SELECTED_NODE, node)
    }
    /// Sets `spec.volumeMode: Block`.
    pub(crate) fn volume_mode_block(mut self) -> Self {
        self.spec().volume_mode = Some("Block".to_owned());
        self
    }
    /// Sets `spec.volumeMode: Filesystem`.
    pub(crate) fn volume_mode_filesystem(mut self) -> Self {
        self.spec().volume_mode = Some("Filesystem".to_owned());
        self
    }
    /// Sets `spec.volumeName` (bound or pre-bound claim).
    pub(crate) fn volume_name(mut self, pv: &str) -> Self {
        self.spec().volume_name = Some(pv.to_owned());
        self
    }
    /// Sets a label selector with one `matchLabels` entry.
    pub(crate) fn selector(mut self, key: &str, value: &str) -> Self {
        let mut labels = BTreeMap::new();
        labels.insert(key.to_owned(), value.to_owned());
        self.spec().selector = Some(LabelSelector {
            match_labels: Some(labels),
            match_expressions: None,
        });
        self
    }
    /// Sets `spec.dataSource`.
    pub(crate) fn data_source(mut self, api_group: Option<&str>, kind: &str, name: &str) -> Self {
        self.spec().data_source = Some(TypedLocalObjectReference {
            api_group: api_group.map(str::to_owned),
            kind: kind.to_owned(),
            name: name.to_owned(),
        });
        self
    }
    /// Sets `spec.dataSourceRef`.
    pub(crate) fn data_source_ref(
        mut self,
        api_group: Option<&str>,
        kind: &str,
        name: &str,
        namespace: Option<&str>,
    ) -> Self {
        self.spec().data_source_ref = Some(TypedObjectReference {
            api_group: api_group.map(str::to_owned),
            kind: kind.to_owned(),
            name: name.to_owned(),
            namespace: namespace.map(str::to_owned),
        });
        self
    }
    /// Sets `spec.volumeAttributesClassName`.
    pub(crate) fn vac(mut self, class: &str) -> Self {
        self.spec().volume_attributes_class_name = Some(class.to_owned());
        self
    }
    /// Sets `status.phase`.
    pub(crate) fn phase(mut self, phase: &str) -> Self {
        self.obj.status.get_or_insert_with(Default::default).phase = Some(phase.to_owned());
        self
    }
}

// === StorageClass ===

/// Builder returned by [`sc`].
#[derive(Clone, Debug)]
pub(crate) struct ScBuilder {
    obj: StorageClass,
}

/// A StorageClass of [`DRIVER`] with UID `uid-<name>` and nothing else set.
pub(crate) fn sc(name: &str) -> ScBuilder {
    ScBuilder {
        obj: StorageClass {
            metadata: meta(None, name, format!("uid-{name}")),
            provisioner: DRIVER.to_owned(),
            ..StorageClass::default()
        },
    }
}

meta_setters!(ScBuilder, StorageClass);

impl ScBuilder {
    /// Sets `provisioner`.
    pub(crate) fn provisioner(mut self, driver: &str) -> Self {
        self.obj.provisioner = driver.to_owned();
        self
    }
    /// Adds one parameter.
    pub(crate) fn param(mut self, key: &str, value: &str) -> Self {
        self.obj
            .parameters
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }
    /// Sets `volumeBindingMode: WaitForFirstConsumer`.
    pub(crate) fn binding_wffc(mut self) -> Self {
        self.obj.volume_binding_mode = Some("WaitForFirstConsumer".to_owned());
        self
    }
    /// Sets `volumeBindingMode: Immediate` explicitly.
    pub(crate) fn binding_immediate(mut self) -> Self {
        self.obj.volume_binding_mode = Some("Immediate".to_owned());
        self
    }
    /// Appends one `allowedTopologies` term: the AND of its `(key, values)` expressions.
    pub(crate) fn allowed_topology<'a, I>(mut self, expressions: I) -> Self
    where
        I: IntoIterator<Item = (&'a str, Vec<&'a str>)>,
    {
        let term = topology_term(expressions);
        self.obj
            .allowed_topologies
            .get_or_insert_with(Vec::new)
            .push(term);
        self
    }
    /// Sets `reclaimPolicy: Retain`.
    pub(crate) fn reclaim_retain(self) -> Self {
        self.reclaim("Retain")
    }
    /// Sets `reclaimPolicy`.
    pub(crate) fn reclaim(mut self, policy: &str) -> Self {
        self.obj.reclaim_policy = Some(policy.to_owned());
        self
    }
    /// Sets `mountOptions`.
    pub(crate) fn mount_options<I, S>(mut self, options: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.obj.mount_options = Some(strings(options));
        self
    }
}

/// One `TopologySelectorTerm` from `(key, values)` expressions.
pub(crate) fn topology_term<'a, I>(expressions: I) -> TopologySelectorTerm
where
    I: IntoIterator<Item = (&'a str, Vec<&'a str>)>,
{
    TopologySelectorTerm {
        match_label_expressions: Some(
            expressions
                .into_iter()
                .map(|(key, values)| TopologySelectorLabelRequirement {
                    key: key.to_owned(),
                    values: strings(values),
                })
                .collect(),
        ),
    }
}

// === PersistentVolume ===

/// Builder returned by [`pv`].
#[derive(Clone, Debug)]
pub(crate) struct PvBuilder {
    obj: PersistentVolume,
}

/// A CSI PV of [`DRIVER`] with handle `handle-<name>`, `ReadWriteOnce`, `1Gi`, no claim, no phase.
pub(crate) fn pv(name: &str) -> PvBuilder {
    let mut capacity = BTreeMap::new();
    capacity.insert("storage".to_owned(), Quantity("1Gi".to_owned()));
    PvBuilder {
        obj: PersistentVolume {
            metadata: meta(None, name, format!("uid-{name}")),
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
                capacity: Some(capacity),
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.to_owned(),
                    volume_handle: format!("handle-{name}"),
                    ..CSIPersistentVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            status: None,
        },
    }
}

meta_setters!(PvBuilder, PersistentVolume);

impl PvBuilder {
    fn spec(&mut self) -> &mut PersistentVolumeSpec {
        self.obj.spec.get_or_insert_with(Default::default)
    }
    fn csi(&mut self) -> &mut CSIPersistentVolumeSource {
        self.spec().csi.get_or_insert_with(Default::default)
    }

    /// Sets `spec.csi.driver`.
    pub(crate) fn driver(mut self, driver: &str) -> Self {
        self.csi().driver = driver.to_owned();
        self
    }
    /// Sets `spec.csi.volumeHandle`.
    pub(crate) fn handle(mut self, handle: &str) -> Self {
        self.csi().volume_handle = handle.to_owned();
        self
    }
    /// Removes `spec.csi` (a non-CSI volume).
    pub(crate) fn no_csi(mut self) -> Self {
        self.spec().csi = None;
        self
    }
    /// Adds one `spec.csi.volumeAttributes` entry.
    pub(crate) fn volume_attribute(mut self, key: &str, value: &str) -> Self {
        self.csi()
            .volume_attributes
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }
    /// Sets `spec.claimRef` to the claim (kind, apiVersion, namespace, name, uid, resourceVersion).
    pub(crate) fn claim(mut self, claim: &PersistentVolumeClaim) -> Self {
        self.spec().claim_ref = Some(ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("PersistentVolumeClaim".to_owned()),
            namespace: claim.metadata.namespace.clone(),
            name: claim.metadata.name.clone(),
            uid: claim.metadata.uid.clone(),
            resource_version: claim.metadata.resource_version.clone(),
            ..ObjectReference::default()
        });
        self
    }
    /// Sets `spec.claimRef` from its parts (for a claim that no longer exists).
    pub(crate) fn claim_ref(mut self, namespace: &str, name: &str, uid: &str) -> Self {
        self.spec().claim_ref = Some(ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("PersistentVolumeClaim".to_owned()),
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            uid: Some(uid.to_owned()),
            ..ObjectReference::default()
        });
        self
    }
    /// Sets `status.phase` (`Pending`, `Available`, `Bound`, `Released`, `Failed`).
    pub(crate) fn phase(mut self, phase: &str) -> Self {
        self.obj
            .status
            .get_or_insert_with(PersistentVolumeStatus::default)
            .phase = Some(phase.to_owned());
        self
    }
    /// Sets `spec.persistentVolumeReclaimPolicy`.
    pub(crate) fn reclaim(mut self, policy: &str) -> Self {
        self.spec().persistent_volume_reclaim_policy = Some(policy.to_owned());
        self
    }
    /// Sets the `pv.kubernetes.io/provisioned-by` annotation.
    pub(crate) fn provisioned_by(self, driver: &str) -> Self {
        self.annotation(names::ANN_PROVISIONED_BY, driver)
    }
    /// Sets the deletion-secret annotation pair (as the provisioner writes it, possibly empty).
    pub(crate) fn deletion_secret(self, name: &str, namespace: &str) -> Self {
        self.annotation(names::ANN_DELETION_SECRET_NAME, name)
            .annotation(names::ANN_DELETION_SECRET_NAMESPACE, namespace)
    }
    /// Sets `spec.storageClassName`.
    pub(crate) fn class(mut self, class: &str) -> Self {
        self.spec().storage_class_name = Some(class.to_owned());
        self
    }
    /// Sets `spec.capacity.storage`.
    pub(crate) fn capacity(mut self, size: &str) -> Self {
        self.spec()
            .capacity
            .get_or_insert_with(BTreeMap::new)
            .insert("storage".to_owned(), Quantity(size.to_owned()));
        self
    }
    /// Sets `spec.csi.controllerPublishSecretRef`.
    pub(crate) fn controller_publish_secret(mut self, name: &str, namespace: &str) -> Self {
        self.csi().controller_publish_secret_ref = Some(SecretReference {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
        });
        self
    }
    /// Appends one required node-selector term: the AND of `key In [value]` expressions, the
    /// shape the provisioner writes from a CSI accessible topology.
    pub(crate) fn node_affinity<'a, I>(mut self, segments: I) -> Self
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let term = NodeSelectorTerm {
            match_expressions: Some(
                segments
                    .into_iter()
                    .map(|(key, value)| NodeSelectorRequirement {
                        key: key.to_owned(),
                        operator: "In".to_owned(),
                        values: Some(vec![value.to_owned()]),
                    })
                    .collect(),
            ),
            match_fields: None,
        };
        self.spec()
            .node_affinity
            .get_or_insert_with(VolumeNodeAffinity::default)
            .required
            .get_or_insert_with(NodeSelector::default)
            .node_selector_terms
            .push(term);
        self
    }
    /// Sets `spec.volumeMode: Block`.
    pub(crate) fn volume_mode_block(mut self) -> Self {
        self.spec().volume_mode = Some("Block".to_owned());
        self
    }
}

#[cfg(test)]
#[path = "testing_tests.rs"]
mod tests;
