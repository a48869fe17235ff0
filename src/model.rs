//! The model layer: typed facts about the Kubernetes objects every concern reads (claims, where
//! volumes live, CSINodes, topology, StorageClass secret templates and their data), so
//! that no concern reads another concern's module to learn a claim's own fields. It depends on
//! [`crate::names`], [`crate::gofmt`], the CSI types and, for the few reads a fact needs (a
//! secret's data, a node's absence), `crate::k8s`; never on a controller.
//!
//! One rule for annotations ([`meta`]): [`meta::annotation`] returns what is stored, an empty
//! string included (Go's `v, ok := m[k]`); accessors for which upstream treats an empty value as
//! unset say so by using [`meta::non_empty_annotation`].

pub(crate) mod claim;
pub(crate) mod locate;
pub(crate) mod meta;
pub(crate) mod secrets;
pub(crate) mod topology;
