//! Builders for cluster objects: Node, CSINode, VolumeAttachment, VolumeAttributesClass.

#![allow(dead_code)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{
    CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment, VolumeAttachmentSource,
    VolumeAttachmentSpec, VolumeAttachmentStatus, VolumeAttributesClass,
};

#[allow(unused_imports)]
use super::{DRIVER, deletion_time, meta, strings};

// === Node and CSINode ===

/// Builder returned by [`node`].
#[derive(Clone, Debug)]
pub(crate) struct NodeBuilder {
    obj: Node,
}

/// A Node with UID `uid-<name>` and no labels.
pub(crate) fn node(name: &str) -> NodeBuilder {
    NodeBuilder {
        obj: Node {
            metadata: meta(None, name, format!("uid-{name}")),
            ..Node::default()
        },
    }
}

meta_setters!(NodeBuilder, Node);

impl NodeBuilder {
    /// Adds several labels.
    pub(crate) fn labels<'a, I>(mut self, labels: I) -> Self
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        for (key, value) in labels {
            self = self.label(key, value);
        }
        self
    }
}

/// Builder returned by [`csinode`].
#[derive(Clone, Debug)]
pub(crate) struct CsiNodeBuilder {
    obj: CSINode,
}

/// A CSINode (named like its Node) with no drivers.
pub(crate) fn csinode(name: &str) -> CsiNodeBuilder {
    CsiNodeBuilder {
        obj: CSINode {
            metadata: meta(None, name, format!("uid-csinode-{name}")),
            spec: CSINodeSpec { drivers: vec![] },
        },
    }
}

meta_setters!(CsiNodeBuilder, CSINode);

impl CsiNodeBuilder {
    /// Registers a driver with its node id and topology keys (an empty list means none reported).
    pub(crate) fn driver<I, S>(mut self, driver: &str, node_id: &str, topology_keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let keys = strings(topology_keys);
        self.obj.spec.drivers.push(CSINodeDriver {
            name: driver.to_owned(),
            node_id: node_id.to_owned(),
            topology_keys: (!keys.is_empty()).then_some(keys),
            allocatable: None,
        });
        self
    }
}

// === VolumeAttachment and VolumeAttributesClass ===

/// Builder returned by [`volume_attachment`].
#[derive(Clone, Debug)]
pub(crate) struct VolumeAttachmentBuilder {
    obj: VolumeAttachment,
}

/// A VolumeAttachment by [`DRIVER`] of PV `pv` to node `node`, not attached.
pub(crate) fn volume_attachment(name: &str, pv: &str, node: &str) -> VolumeAttachmentBuilder {
    VolumeAttachmentBuilder {
        obj: VolumeAttachment {
            metadata: meta(None, name, format!("uid-{name}")),
            spec: VolumeAttachmentSpec {
                attacher: DRIVER.to_owned(),
                node_name: node.to_owned(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some(pv.to_owned()),
                    inline_volume_spec: None,
                },
            },
            status: None,
        },
    }
}

meta_setters!(VolumeAttachmentBuilder, VolumeAttachment);

impl VolumeAttachmentBuilder {
    /// Sets `spec.attacher`.
    pub(crate) fn attacher(mut self, driver: &str) -> Self {
        self.obj.spec.attacher = driver.to_owned();
        self
    }
    /// Sets `status.attached`.
    pub(crate) fn attached(mut self, attached: bool) -> Self {
        self.obj
            .status
            .get_or_insert_with(VolumeAttachmentStatus::default)
            .attached = attached;
        self
    }
}

/// Builder returned by [`vac`].
#[derive(Clone, Debug)]
pub(crate) struct VacBuilder {
    obj: VolumeAttributesClass,
}

/// A VolumeAttributesClass of [`DRIVER`] with no parameters.
pub(crate) fn vac(name: &str) -> VacBuilder {
    VacBuilder {
        obj: VolumeAttributesClass {
            metadata: meta(None, name, format!("uid-{name}")),
            driver_name: DRIVER.to_owned(),
            parameters: None,
        },
    }
}

meta_setters!(VacBuilder, VolumeAttributesClass);

impl VacBuilder {
    /// Sets `driverName`.
    pub(crate) fn driver(mut self, driver: &str) -> Self {
        self.obj.driver_name = driver.to_owned();
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
}
