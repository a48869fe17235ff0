//! The named checks: the registry in run order, what each needs from the driver, and why a
//! check is skipped when the driver does not offer it.

mod identity;
mod listing;
mod node;
mod snapshots;
mod topology;
mod volumes;

use futures::future::BoxFuture;

use crate::context::{Ctx, Verdict};
use crate::csi::v1::{
    controller_service_capability::rpc::Type as Rpc, plugin_capability::service::Type as Service,
};

/// Something a check needs; missing means SKIP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A controller capability.
    Rpc(Rpc),
    /// A plugin service capability.
    Service(Service),
    /// A non-empty section of the secrets file.
    Secret(&'static str),
    /// `--test-volume-mutable-parameter` values.
    MutableParameters,
    /// NodeGetInfo reported a topology.
    NodeTopology,
}

impl Need {
    /// Why the check is skipped, when this need is not met.
    pub fn missing(self, ctx: &Ctx) -> Option<String> {
        match self {
            Need::Rpc(rpc) => match &ctx.controller_caps {
                Err(e) => Some(format!("controller capabilities unknown ({e})")),
                Ok(_) if ctx.has_rpc(rpc) => None,
                Ok(_) => Some(format!("driver does not advertise {}", rpc.as_str_name())),
            },
            Need::Service(s) => match &ctx.plugin_caps {
                Err(e) => Some(format!("plugin capabilities unknown ({e})")),
                Ok(_) if ctx.has_service(s) => None,
                Ok(_) => Some(format!("driver does not advertise {}", s.as_str_name())),
            },
            Need::Secret(section) => {
                (!ctx.opts.secrets.has(section)).then(|| format!("no {section} in --secrets-file"))
            }
            Need::MutableParameters => ctx
                .opts
                .test_volume_mutable_parameters
                .is_empty()
                .then(|| "no --test-volume-mutable-parameter given".to_owned()),
            Need::NodeTopology => match &ctx.node_info {
                Err(e) => Some(format!("node topology unknown ({e})")),
                Ok(_) if ctx.node_topology().is_some() => None,
                Ok(_) => Some("NodeGetInfo reports no accessible_topology".to_owned()),
            },
        }
    }
}

type Body = for<'a> fn(&'a Ctx) -> BoxFuture<'a, Verdict>;

/// One named check.
#[derive(Clone, Copy)]
pub struct Check {
    /// Unique name, `service/subject/rule`.
    pub name: &'static str,
    /// What it verifies.
    pub about: &'static str,
    /// What it needs from the driver.
    pub needs: &'static [Need],
    body: Body,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Check {
    /// Runs the body (the caller checks needs and cleans up).
    pub fn run<'a>(&self, ctx: &'a Ctx) -> BoxFuture<'a, Verdict> {
        (self.body)(ctx)
    }

    /// The first unmet need, as a skip reason.
    pub fn skip_reason(&self, ctx: &Ctx) -> Option<String> {
        self.needs.iter().find_map(|n| n.missing(ctx))
    }
}

macro_rules! check {
    ($name:literal, $about:literal, [$($need:expr),* $(,)?], $body:path) => {
        Check { name: $name, about: $about, needs: &[$($need),*], body: |ctx| Box::pin($body(ctx)) }
    };
}

use Need::*;

/// Every check, in run order.
pub fn all() -> Vec<Check> {
    vec![
        check!(
            "identity/plugin-info",
            "GetPluginInfo returns a valid driver name and a vendor version",
            [],
            identity::plugin_info
        ),
        check!(
            "identity/plugin-capabilities",
            "GetPluginCapabilities succeeds with well-formed capabilities",
            [],
            identity::plugin_capabilities
        ),
        check!(
            "identity/probe",
            "Probe succeeds and the driver becomes ready within --timeout",
            [],
            identity::probe
        ),
        check!(
            "controller/capabilities",
            "ControllerGetCapabilities succeeds and advertises what dynamic provisioning needs (CONTROLLER_SERVICE, CREATE_DELETE_VOLUME)",
            [],
            identity::controller_capabilities
        ),
        check!(
            "node/get-info",
            "NodeGetInfo returns a node id (and a topology when VOLUME_ACCESSIBILITY_CONSTRAINTS is advertised)",
            [],
            topology::node_info
        ),
        check!(
            "controller/create-volume/basic",
            "CreateVolume returns a volume id and at least the requested capacity; DeleteVolume removes it",
            [Rpc(Rpc::CreateDeleteVolume)],
            volumes::basic
        ),
        check!(
            "controller/create-volume/missing-name",
            "CreateVolume without a name is INVALID_ARGUMENT",
            [Rpc(Rpc::CreateDeleteVolume)],
            volumes::missing_name
        ),
        check!(
            "controller/create-volume/missing-capabilities",
            "CreateVolume without volume capabilities is INVALID_ARGUMENT",
            [Rpc(Rpc::CreateDeleteVolume)],
            volumes::missing_capabilities
        ),
        check!(
            "controller/create-volume/idempotent",
            "CreateVolume twice with the same name and arguments returns the same volume",
            [Rpc(Rpc::CreateDeleteVolume)],
            volumes::idempotent
        ),
        check!(
            "controller/create-volume/incompatible-size",
            "CreateVolume with an existing name but an incompatible size is ALREADY_EXISTS",
            [Rpc(Rpc::CreateDeleteVolume)],
            volumes::incompatible_size
        ),
        check!(
            "controller/create-volume/exact-capacity",
            "CreateVolume with required_bytes = limit_bytes returns exactly that size (or OUT_OF_RANGE)",
            [Rpc(Rpc::CreateDeleteVolume)],
            volumes::exact_capacity
        ),
        check!(
            "controller/create-volume/required-above-limit",
            "CreateVolume with required_bytes > limit_bytes is INVALID_ARGUMENT or OUT_OF_RANGE",
            [Rpc(Rpc::CreateDeleteVolume)],
            volumes::required_above_limit
        ),
        check!(
            "controller/create-volume/above-maximum",
            "CreateVolume above GetCapacity's maximum_volume_size is OUT_OF_RANGE",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::GetCapacity)],
            volumes::above_maximum
        ),
        check!(
            "controller/create-volume/topology",
            "CreateVolume with the node's topology as requisite returns an accessible_topology within it",
            [
                Rpc(Rpc::CreateDeleteVolume),
                Service(Service::VolumeAccessibilityConstraints),
                NodeTopology
            ],
            topology::create_in_topology
        ),
        check!(
            "controller/create-volume/without-secrets",
            "CreateVolume without the configured secrets is rejected with UNAUTHENTICATED, PERMISSION_DENIED or INVALID_ARGUMENT (SKIP if the driver accepts it)",
            [Rpc(Rpc::CreateDeleteVolume), Secret("CreateVolumeSecret")],
            volumes::create_without_secrets
        ),
        check!(
            "controller/delete-volume/missing-id",
            "DeleteVolume without a volume id is INVALID_ARGUMENT",
            [Rpc(Rpc::CreateDeleteVolume)],
            volumes::delete_missing_id
        ),
        check!(
            "controller/delete-volume/unknown-id",
            "DeleteVolume of an id that does not exist is OK",
            [Rpc(Rpc::CreateDeleteVolume)],
            volumes::delete_unknown_id
        ),
        check!(
            "controller/delete-volume/idempotent",
            "DeleteVolume twice on the same volume is OK both times",
            [Rpc(Rpc::CreateDeleteVolume)],
            volumes::delete_idempotent
        ),
        check!(
            "controller/delete-volume/without-secrets",
            "DeleteVolume without the configured secrets is rejected (SKIP if the driver accepts it)",
            [Rpc(Rpc::CreateDeleteVolume), Secret("DeleteVolumeSecret")],
            volumes::delete_without_secrets
        ),
        check!(
            "controller/list-volumes/created-and-deleted",
            "ListVolumes lists a created volume and stops listing it once deleted",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::ListVolumes)],
            listing::created_and_deleted
        ),
        check!(
            "controller/list-volumes/pagination",
            "ListVolumes with max_entries and next_token visits every volume exactly once",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::ListVolumes)],
            listing::pagination
        ),
        check!(
            "controller/list-volumes/invalid-token",
            "ListVolumes with a starting_token the driver never issued is ABORTED",
            [Rpc(Rpc::ListVolumes)],
            listing::invalid_token
        ),
        check!(
            "controller/get-capacity",
            "GetCapacity succeeds with non-negative sizes, also for the node's topology segment",
            [Rpc(Rpc::GetCapacity)],
            listing::get_capacity
        ),
        check!(
            "controller/create-snapshot/basic",
            "CreateSnapshot returns a snapshot id, the source volume id and a creation time",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::CreateDeleteSnapshot)],
            snapshots::basic
        ),
        check!(
            "controller/create-snapshot/idempotent",
            "CreateSnapshot twice with the same name and source returns the same snapshot",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::CreateDeleteSnapshot)],
            snapshots::idempotent
        ),
        check!(
            "controller/create-snapshot/name-conflict",
            "CreateSnapshot with an existing name but another source is ALREADY_EXISTS",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::CreateDeleteSnapshot)],
            snapshots::name_conflict
        ),
        check!(
            "controller/create-snapshot/missing-fields",
            "CreateSnapshot without a name or a source volume id is INVALID_ARGUMENT",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::CreateDeleteSnapshot)],
            snapshots::missing_fields
        ),
        check!(
            "controller/delete-snapshot/missing-id",
            "DeleteSnapshot without a snapshot id is INVALID_ARGUMENT",
            [Rpc(Rpc::CreateDeleteSnapshot)],
            snapshots::delete_missing_id
        ),
        check!(
            "controller/delete-snapshot/unknown-id",
            "DeleteSnapshot of an id that does not exist is OK",
            [Rpc(Rpc::CreateDeleteSnapshot)],
            snapshots::delete_unknown_id
        ),
        check!(
            "controller/list-snapshots/created",
            "ListSnapshots finds a created snapshot by id and by source volume",
            [
                Rpc(Rpc::CreateDeleteVolume),
                Rpc(Rpc::CreateDeleteSnapshot),
                Rpc(Rpc::ListSnapshots)
            ],
            snapshots::listed
        ),
        check!(
            "controller/list-snapshots/invalid-token",
            "ListSnapshots with a starting_token the driver never issued is ABORTED",
            [Rpc(Rpc::ListSnapshots)],
            snapshots::invalid_token
        ),
        check!(
            "controller/create-volume/from-snapshot",
            "CreateVolume from a snapshot reports that snapshot as content_source",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::CreateDeleteSnapshot)],
            snapshots::restore
        ),
        check!(
            "controller/create-volume/from-missing-snapshot",
            "CreateVolume from a snapshot that does not exist is NOT_FOUND",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::CreateDeleteSnapshot)],
            snapshots::restore_missing
        ),
        check!(
            "controller/create-volume/clone",
            "CreateVolume from a volume reports that volume as content_source",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::CloneVolume)],
            snapshots::clone
        ),
        check!(
            "controller/create-volume/clone-missing-source",
            "CreateVolume from a volume that does not exist is NOT_FOUND",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::CloneVolume)],
            snapshots::clone_missing
        ),
        check!(
            "controller/create-volume/mutable-parameters",
            "CreateVolume with the test mutable parameters (a VolumeAttributesClass) succeeds",
            [
                Rpc(Rpc::CreateDeleteVolume),
                Rpc(Rpc::ModifyVolume),
                MutableParameters
            ],
            volumes::create_with_mutable
        ),
        check!(
            "controller/create-volume/unsupported-mutable-parameter",
            "CreateVolume with a mutable parameter the driver does not support is INVALID_ARGUMENT",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::ModifyVolume)],
            volumes::create_with_unsupported_mutable
        ),
        check!(
            "controller/modify-volume/missing-id",
            "ControllerModifyVolume without a volume id is INVALID_ARGUMENT",
            [Rpc(Rpc::ModifyVolume)],
            volumes::modify_missing_id
        ),
        check!(
            "controller/modify-volume/unknown-volume",
            "ControllerModifyVolume of a volume that does not exist is NOT_FOUND, with or without mutable parameters",
            [Rpc(Rpc::ModifyVolume)],
            volumes::modify_unknown
        ),
        check!(
            "controller/modify-volume/unsupported-parameter",
            "ControllerModifyVolume with a mutable parameter the driver does not support is INVALID_ARGUMENT",
            [Rpc(Rpc::CreateDeleteVolume), Rpc(Rpc::ModifyVolume)],
            volumes::modify_unsupported
        ),
        check!(
            "controller/modify-volume/basic",
            "ControllerModifyVolume with the test mutable parameters succeeds on a volume created without them",
            [
                Rpc(Rpc::CreateDeleteVolume),
                Rpc(Rpc::ModifyVolume),
                MutableParameters
            ],
            volumes::modify_basic
        ),
        check!(
            "controller/modify-volume/created-with-parameters",
            "ControllerModifyVolume with the test mutable parameters succeeds on a volume created with them",
            [
                Rpc(Rpc::CreateDeleteVolume),
                Rpc(Rpc::ModifyVolume),
                MutableParameters
            ],
            volumes::modify_created_with_parameters
        ),
        check!(
            "controller/modify-volume/created-with-parameters-unsupported-parameter",
            "ControllerModifyVolume with an unsupported mutable parameter is INVALID_ARGUMENT on a volume created with the test ones",
            [
                Rpc(Rpc::CreateDeleteVolume),
                Rpc(Rpc::ModifyVolume),
                MutableParameters
            ],
            volumes::modify_created_with_parameters_unsupported
        ),
        check!(
            "node/publish-volume/target-path",
            "NodePublishVolume creates target_path and NodeUnpublishVolume removes it again",
            [Rpc(Rpc::CreateDeleteVolume)],
            node::target_path
        ),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn check_names_are_unique_and_well_formed() {
        let checks = super::all();
        let mut names: Vec<&str> = checks.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), checks.len(), "duplicate check names");
        for n in names {
            assert!(
                n.split('/').count() >= 2
                    && n.chars()
                        .all(|c| c.is_ascii_lowercase() || c == '/' || c == '-'),
                "{n}"
            );
        }
    }
}
