//! Every wire string the sidecar reads or writes: annotations, finalizers, StorageClass parameter
//! keys, event reasons, labels. Upstream-compatible strings match the Go sidecar byte for byte
//! (`shared/reference/upstream-external-provisioner.md` §3); our own additions live under
//! `csi-provisioner.rs/` so they can never collide with a Kubernetes-owned key.

// === Annotations read on PVCs ===

/// GA provisioner annotation set by the PV controller; must name our driver.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Beta provisioner annotation, read when the GA one is absent.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// CSI migration marker on PVCs and PVs.
pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
/// Node chosen by the scheduler (delayed binding) or by a node-deployment instance.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Beta storage-class annotation; takes precedence over `spec.storageClassName`.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

// === Annotations written on PVs ===

/// Which provisioner created a PV; the ownership check for deletion.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Resolved provisioner secret name used for DeleteVolume (always set, may be empty).
pub const ANN_DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
/// Resolved provisioner secret namespace used for DeleteVolume (always set, may be empty).
pub const ANN_DELETION_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// Controller-modify secret name, read by external-resizer.
pub const ANN_MODIFY_SECRET_NAME: &str = "volume.kubernetes.io/controller-modify-secret-name";
/// Controller-modify secret namespace, read by external-resizer.
pub const ANN_MODIFY_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/controller-modify-secret-namespace";
/// Set by the PV controller once it has bound a PV/PVC pair.
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Set by the PV controller on PVs it bound itself.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// Key in `pv.spec.csi.volumeAttributes` holding the provisioner identity.
pub const VOLUME_ATTR_PROVISIONER_IDENTITY: &str = "storage.kubernetes.io/csiProvisionerIdentity";
/// VolumeSnapshotContent annotation that allows a volume-mode change on restore.
pub const ANN_ALLOW_VOLUME_MODE_CHANGE: &str =
    "snapshot.storage.kubernetes.io/allow-volume-mode-change";

// === Finalizers ===

/// KEP-2644 deletion-protection finalizer on PVs we own.
pub const FINALIZER_PV_DELETION_PROTECTION: &str =
    "external-provisioner.volume.kubernetes.io/finalizer";
/// Clone-source protection finalizer on source PVCs.
pub const FINALIZER_CLONING_PROTECTION: &str =
    "provisioner.storage.kubernetes.io/cloning-protection";
/// Snapshot-source protection finalizer on VolumeSnapshots.
pub const FINALIZER_SNAPSHOT_SOURCE_PROTECTION: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// Kubernetes' own PV protection finalizer (never touched by us).
pub const FINALIZER_PV_PROTECTION: &str = "kubernetes.io/pv-protection";

// === Our own keys (extensions over upstream) ===

/// PVC finalizer written *before* the first CreateVolume and removed only once the PV exists or the
/// volume has been deleted again: the durable record of a provisioning intent (upstream issue 486).
pub const FINALIZER_PROVISIONING_INTENT: &str = "csi-provisioner.rs/provisioning-intent";
/// Lease annotation of an intent-ledger shard: its entries (JSON list).
pub const LEDGER_ENTRIES_ANNOTATION: &str = "csi-provisioner.rs/intents";
/// Lease label of a node's intent ledger (node mode), valued with the ledger's name: the dead-node
/// clean-up lists every node's ledger with it.
pub const LEDGER_NODE_LABEL: &str = "csi-provisioner.rs/intent-ledger-node";
/// Lease annotation of a node's intent ledger: the node's name (too long for a label value).
pub const LEDGER_NODE_ANNOTATION: &str = "csi-provisioner.rs/node";
/// PVC annotation next to [`FINALIZER_PROVISIONING_INTENT`]: the volume name CreateVolume was called with.
pub const ANN_INTENT_VOLUME_NAME: &str = "csi-provisioner.rs/volume-name";
/// PVC annotation: the volume id once CreateVolume has answered (lets clean-up skip the replay).
pub const ANN_INTENT_VOLUME_ID: &str = "csi-provisioner.rs/volume-id";
/// PVC annotations: the provisioner secret used for the intent, needed to delete the volume again.
pub const ANN_INTENT_SECRET_NAME: &str = "csi-provisioner.rs/secret-name";
/// See [`ANN_INTENT_SECRET_NAME`].
pub const ANN_INTENT_SECRET_NAMESPACE: &str = "csi-provisioner.rs/secret-namespace";
/// PVC annotation: the CreateVolume request of the intent (protobuf without secrets, base64), to
/// replay exactly when the volume id is unknown.
pub const ANN_INTENT_REQUEST: &str = "csi-provisioner.rs/create-request";
/// PVC annotation: `"true"` when the class's reclaim policy is Retain (see the intent ledger's
/// `Entry::may_be_kept`).
pub const ANN_INTENT_RETAIN: &str = "csi-provisioner.rs/reclaim-retain";
/// PVC annotation (`--track-unused-claims`): RFC 3339 time the last Pod using the claim went away;
/// removed when a Pod uses it again. Written only on those transitions.
pub const ANN_UNUSED_SINCE: &str = "csi-provisioner.rs/unused-since";
/// PVC condition type maintained by Kubernetes itself where KEP-5541 is enabled: read instead of
/// [`ANN_UNUSED_SINCE`], and then nothing is written.
pub const CONDITION_UNUSED: &str = "Unused";
/// StorageClass annotation: stop provisioning a claim after this many failed attempts (a backend
/// out of quota or billing); absent, provisioning retries forever with backoff as upstream.
pub const ANN_MAX_PROVISIONING_FAILURES: &str = "csi-provisioner.rs/max-provisioning-failures";
/// PVC annotation written when [`ANN_MAX_PROVISIONING_FAILURES`] stopped provisioning the claim:
/// the last error. Removing it retries.
pub const ANN_PROVISIONING_STOPPED: &str = "csi-provisioner.rs/provisioning-stopped";
/// PV annotation (CSI migration of Azure File): the driver's volume id of the share, which the
/// in-tree source cannot hold; the key the claims' intent record uses for the same fact.
pub const ANN_PV_VOLUME_ID: &str = "csi-provisioner.rs/volume-id";
/// PV annotation: name of the Node the volume was provisioned on (node-deployment mode).
pub const ANN_NODE_NAME: &str = "csi-provisioner.rs/node-name";
/// PV annotation: UID of that Node, so a re-created Node of the same name is told apart.
pub const ANN_NODE_UID: &str = "csi-provisioner.rs/node-uid";

// === StorageClass parameters ===

/// Prefix of the reserved StorageClass parameter keys.
pub const PARAM_PREFIX: &str = "csi.storage.k8s.io/";
/// Prefixed fsType key.
pub const PARAM_FSTYPE: &str = "csi.storage.k8s.io/fstype";
/// Extra-create-metadata keys added to CreateVolume parameters.
pub const PARAM_PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
/// See [`PARAM_PVC_NAME`].
pub const PARAM_PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
/// See [`PARAM_PVC_NAME`].
pub const PARAM_PV_NAME: &str = "csi.storage.k8s.io/pv/name";

// Secret reference keys: a name/namespace pair per secret type, plus the default pair used when a
// type has neither key. Values are templates (`${pv.name}`, `${pvc.namespace}`, ...).

/// Default secret name for every type without its own pair.
pub const PARAM_SECRET_NAME: &str = "csi.storage.k8s.io/secret-name";
/// Default secret namespace for every type without its own pair.
pub const PARAM_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/secret-namespace";
/// CreateVolume / DeleteVolume secret name.
pub const PARAM_PROVISIONER_SECRET_NAME: &str = "csi.storage.k8s.io/provisioner-secret-name";
/// CreateVolume / DeleteVolume secret namespace.
pub const PARAM_PROVISIONER_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/provisioner-secret-namespace";
/// ControllerPublishVolume secret name.
pub const PARAM_CONTROLLER_PUBLISH_SECRET_NAME: &str =
    "csi.storage.k8s.io/controller-publish-secret-name";
/// ControllerPublishVolume secret namespace.
pub const PARAM_CONTROLLER_PUBLISH_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/controller-publish-secret-namespace";
/// NodeStageVolume secret name.
pub const PARAM_NODE_STAGE_SECRET_NAME: &str = "csi.storage.k8s.io/node-stage-secret-name";
/// NodeStageVolume secret namespace.
pub const PARAM_NODE_STAGE_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/node-stage-secret-namespace";
/// NodePublishVolume secret name.
pub const PARAM_NODE_PUBLISH_SECRET_NAME: &str = "csi.storage.k8s.io/node-publish-secret-name";
/// NodePublishVolume secret namespace.
pub const PARAM_NODE_PUBLISH_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/node-publish-secret-namespace";
/// ControllerExpandVolume secret name.
pub const PARAM_CONTROLLER_EXPAND_SECRET_NAME: &str =
    "csi.storage.k8s.io/controller-expand-secret-name";
/// ControllerExpandVolume secret namespace.
pub const PARAM_CONTROLLER_EXPAND_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/controller-expand-secret-namespace";
/// NodeExpandVolume secret name.
pub const PARAM_NODE_EXPAND_SECRET_NAME: &str = "csi.storage.k8s.io/node-expand-secret-name";
/// NodeExpandVolume secret namespace.
pub const PARAM_NODE_EXPAND_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/node-expand-secret-namespace";
/// ControllerModifyVolume secret name (read by external-resizer through a PV annotation).
pub const PARAM_CONTROLLER_MODIFY_SECRET_NAME: &str =
    "csi.storage.k8s.io/controller-modify-secret-name";
/// ControllerModifyVolume secret namespace.
pub const PARAM_CONTROLLER_MODIFY_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/controller-modify-secret-namespace";
/// Deprecated (unprefixed, not stripped) provisioner secret name.
pub const PARAM_DEPRECATED_PROVISIONER_SECRET_NAME: &str = "csiProvisionerSecretName";
/// Deprecated provisioner secret namespace.
pub const PARAM_DEPRECATED_PROVISIONER_SECRET_NAMESPACE: &str = "csiProvisionerSecretNamespace";
/// Deprecated controller-publish secret name.
pub const PARAM_DEPRECATED_CONTROLLER_PUBLISH_SECRET_NAME: &str = "csiControllerPublishSecretName";
/// Deprecated controller-publish secret namespace.
pub const PARAM_DEPRECATED_CONTROLLER_PUBLISH_SECRET_NAMESPACE: &str =
    "csiControllerPublishSecretNamespace";
/// Deprecated node-stage secret name.
pub const PARAM_DEPRECATED_NODE_STAGE_SECRET_NAME: &str = "csiNodeStageSecretName";
/// Deprecated node-stage secret namespace.
pub const PARAM_DEPRECATED_NODE_STAGE_SECRET_NAMESPACE: &str = "csiNodeStageSecretNamespace";
/// Deprecated node-publish secret name.
pub const PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAME: &str = "csiNodePublishSecretName";
/// Deprecated node-publish secret namespace.
pub const PARAM_DEPRECATED_NODE_PUBLISH_SECRET_NAMESPACE: &str = "csiNodePublishSecretNamespace";

// === Event reasons ===

/// Normal, on the PVC, before every CreateVolume.
pub const EVENT_PROVISIONING: &str = "Provisioning";
/// Normal, on the PVC, after the PV object is saved.
pub const EVENT_PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
/// Warning, on the PVC, on any provisioning error.
pub const EVENT_PROVISIONING_FAILED: &str = "ProvisioningFailed";
/// Warning, on the PV, when deletion fails.
pub const EVENT_VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";
/// Warning, on the PVC, when cleaning up a volume after a failed provisioning failed.
pub const EVENT_PROVISIONING_CLEANUP_FAILED: &str = "ProvisioningCleanupFailed";
/// Normal, on the PV, when a volume of a node that no longer exists is answered as deleted.
pub const EVENT_VOLUME_NODE_GONE: &str = "VolumeNodeGone";
/// Warning, on the PVC, when a selected node has no instance of our driver and is cleared.
pub const EVENT_SELECTED_NODE_CLEARED: &str = "SelectedNodeCleared";

/// Event source component of the csi-prov part of upstream.
pub const EVENT_COMPONENT: &str = "external-provisioner";

// === Labels ===

/// CSIStorageCapacity label naming the driver.
pub const LABEL_DRIVER_NAME: &str = "csi.storage.k8s.io/drivername";
/// CSIStorageCapacity label naming the managing instance.
pub const LABEL_MANAGED_BY: &str = "csi.storage.k8s.io/managed-by";
/// PV label (ours): the driver of a PV we manage, so node-mode instances can list and watch only
/// their driver's PVs (see `node_mode::scope`).
pub const LABEL_PV_DRIVER: &str = "csi-provisioner.rs/driver";
/// PV label (ours): the node whose instance handles the PV in node-deployment mode, or
/// [`LABEL_VALUE_ANY_NODE`]; each instance watches only its own value (see `node_mode::scope`).
pub const LABEL_PV_NODE: &str = "csi-provisioner.rs/node";
/// Value of [`LABEL_PV_NODE`] for PVs not pinned to one node (no or zonal node affinity), which
/// every instance may handle. The underscore makes it impossible as a node name.
pub const LABEL_VALUE_ANY_NODE: &str = "any_node";

// === Kubernetes API values the reclaim path compares against ===

/// PV phase: bound to a claim.
pub const PV_PHASE_BOUND: &str = "Bound";
/// PV phase: its claim was deleted; the reclaim policy applies.
pub const PV_PHASE_RELEASED: &str = "Released";
/// PV phase: automatic reclamation failed.
pub const PV_PHASE_FAILED: &str = "Failed";
/// Reclaim policy: delete the backend volume once released.
pub const RECLAIM_DELETE: &str = "Delete";
/// Reclaim policy: scrub and reuse (deprecated; never deleted by a provisioner).
pub const RECLAIM_RECYCLE: &str = "Recycle";
/// Namespace of Events about cluster-scoped objects (client-go's `metav1.NamespaceDefault`).
pub const EVENT_NAMESPACE_CLUSTER_SCOPED: &str = "default";
