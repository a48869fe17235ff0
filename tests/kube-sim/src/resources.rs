//! The table of served resources: group, version, kind, plural, scope and subresources.

/// One served resource. All resources share one code path; this row is what differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub has_status: bool,
    pub short_names: &'static [&'static str],
    /// Key of the shared store: core/v1 and events.k8s.io/v1 Events are one store.
    pub storage: &'static str,
    /// Custom resources (CRDs) track metadata.generation and refuse strategic merge patch.
    pub custom: bool,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `persistentvolumes` or `storageclasses.storage.k8s.io`, as used in error messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn is_events_v1(&self) -> bool {
        self.group == "events.k8s.io"
    }
}

const fn def(
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    has_status: bool,
    short_names: &'static [&'static str],
) -> ResourceDef {
    ResourceDef {
        group,
        version: "v1",
        kind,
        plural,
        singular,
        namespaced,
        has_status,
        short_names,
        storage: plural,
        custom: false,
    }
}

const fn crd(d: ResourceDef) -> ResourceDef {
    ResourceDef { custom: true, ..d }
}

pub const PV: &str = "persistentvolumes";
pub const PVC: &str = "persistentvolumeclaims";
pub const PODS: &str = "pods";
pub const NODES: &str = "nodes";
pub const NAMESPACES: &str = "namespaces";
pub const EVENTS: &str = "events";
pub const STORAGE_CLASSES: &str = "storageclasses";
pub const SSAR: &str = "selfsubjectaccessreviews";
/// SelfSubjectRulesReview (answered like [`SSAR`], never stored).
pub const SSRR: &str = "selfsubjectrulesreviews";

pub static RESOURCES: &[ResourceDef] = &[
    def(
        "",
        "PersistentVolume",
        PV,
        "persistentvolume",
        false,
        true,
        &["pv"],
    ),
    def(
        "",
        "PersistentVolumeClaim",
        PVC,
        "persistentvolumeclaim",
        true,
        true,
        &["pvc"],
    ),
    def("", "Node", "nodes", "node", false, true, &["no"]),
    def("", "Pod", PODS, "pod", true, true, &["po"]),
    def("", "Secret", "secrets", "secret", true, false, &[]),
    def(
        "",
        "Namespace",
        NAMESPACES,
        "namespace",
        false,
        true,
        &["ns"],
    ),
    def("", "Event", EVENTS, "event", true, false, &["ev"]),
    // Served so that the deploy/ manifests apply as they would to a cluster (stored, no controller).
    def(
        "",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        true,
        false,
        &["sa"],
    ),
    def(
        "apps",
        "Deployment",
        "deployments",
        "deployment",
        true,
        true,
        &["deploy"],
    ),
    def(
        "apps",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        true,
        &["ds"],
    ),
    def(
        "apps",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
        true,
        &["rs"],
    ),
    // Create-only and never stored: answered from the fault rules (see `access.rs`).
    def(
        "authorization.k8s.io",
        "SelfSubjectAccessReview",
        SSAR,
        "selfsubjectaccessreview",
        false,
        false,
        &[],
    ),
    def(
        "authorization.k8s.io",
        "SelfSubjectRulesReview",
        SSRR,
        "selfsubjectrulesreview",
        false,
        false,
        &[],
    ),
    def(
        "rbac.authorization.k8s.io",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
        false,
        &[],
    ),
    def(
        "rbac.authorization.k8s.io",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
        false,
        &[],
    ),
    def(
        "rbac.authorization.k8s.io",
        "Role",
        "roles",
        "role",
        true,
        false,
        &[],
    ),
    def(
        "rbac.authorization.k8s.io",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
        false,
        &[],
    ),
    def(
        "storage.k8s.io",
        "StorageClass",
        STORAGE_CLASSES,
        "storageclass",
        false,
        false,
        &["sc"],
    ),
    def(
        "storage.k8s.io",
        "CSINode",
        "csinodes",
        "csinode",
        false,
        false,
        &[],
    ),
    def(
        "storage.k8s.io",
        "CSIDriver",
        "csidrivers",
        "csidriver",
        false,
        false,
        &[],
    ),
    def(
        "storage.k8s.io",
        "CSIStorageCapacity",
        "csistoragecapacities",
        "csistoragecapacity",
        true,
        false,
        &[],
    ),
    def(
        "storage.k8s.io",
        "VolumeAttachment",
        "volumeattachments",
        "volumeattachment",
        false,
        true,
        &[],
    ),
    def(
        "storage.k8s.io",
        "VolumeAttributesClass",
        "volumeattributesclasses",
        "volumeattributesclass",
        false,
        false,
        &["vac"],
    ),
    def(
        "coordination.k8s.io",
        "Lease",
        "leases",
        "lease",
        true,
        false,
        &[],
    ),
    def(
        "events.k8s.io",
        "Event",
        EVENTS,
        "event",
        true,
        false,
        &["ev"],
    ),
    crd(def(
        "snapshot.storage.k8s.io",
        "VolumeSnapshot",
        "volumesnapshots",
        "volumesnapshot",
        true,
        true,
        &["vs"],
    )),
    crd(def(
        "snapshot.storage.k8s.io",
        "VolumeSnapshotContent",
        "volumesnapshotcontents",
        "volumesnapshotcontent",
        false,
        true,
        &["vsc", "vscs"],
    )),
    crd(def(
        "snapshot.storage.k8s.io",
        "VolumeSnapshotClass",
        "volumesnapshotclasses",
        "volumesnapshotclass",
        false,
        false,
        &["vsclass", "vsclasses"],
    )),
    // Cross-namespace data sources (the CrossNamespaceVolumeDataSource gate) are allowed by these.
    ResourceDef {
        version: "v1beta1",
        ..crd(def(
            "gateway.networking.k8s.io",
            "ReferenceGrant",
            "referencegrants",
            "referencegrant",
            true,
            false,
            &["refgrant"],
        ))
    },
];

/// Groups in the order `/apis` lists them.
pub const GROUPS: &[&str] = &[
    "apps",
    "rbac.authorization.k8s.io",
    "authorization.k8s.io",
    "storage.k8s.io",
    "coordination.k8s.io",
    "events.k8s.io",
    "snapshot.storage.k8s.io",
    "gateway.networking.k8s.io",
];

pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The definition used to store (and by controllers to write) a storage key.
pub fn by_storage(storage: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.storage == storage && !r.is_events_v1())
}

pub fn core(plural: &str) -> &'static ResourceDef {
    // The table is static and every caller names a row that exists.
    match find("", "v1", plural) {
        Some(r) => r,
        None => &RESOURCES[0],
    }
}

pub fn storage_class() -> &'static ResourceDef {
    match find("storage.k8s.io", "v1", STORAGE_CLASSES) {
        Some(r) => r,
        None => &RESOURCES[0],
    }
}
