//! CSI Node operations. Nothing is mounted, but the target path is handled as the spec asks of
//! a real driver: NodePublishVolume creates it (a directory for mount volumes, a file for block
//! volumes) and NodeUnpublishVolume removes it again.

use std::io::ErrorKind;
use std::path::Path;

use tonic::Status;

use crate::config::Misbehaviour;
use crate::csi::v1::*;
use crate::driver::Driver;
use crate::rules::required;

impl Driver {
    /// NodeStageVolume: checks the required fields. The staging path belongs to the CO, which
    /// creates it; nothing is mounted there.
    pub fn node_stage(
        &self,
        req: NodeStageVolumeRequest,
    ) -> Result<NodeStageVolumeResponse, Status> {
        required("volume_id", &req.volume_id)?;
        required_path("staging_target_path", &req.staging_target_path)?;
        req.volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        Ok(NodeStageVolumeResponse {})
    }

    /// NodeUnstageVolume: checks the required fields.
    pub fn node_unstage(
        &self,
        req: NodeUnstageVolumeRequest,
    ) -> Result<NodeUnstageVolumeResponse, Status> {
        required("volume_id", &req.volume_id)?;
        required_path("staging_target_path", &req.staging_target_path)?;
        Ok(NodeUnstageVolumeResponse {})
    }

    /// NodePublishVolume: creates `target_path` (the spec makes that the plugin's job; the CO
    /// only guarantees its parent). Publishing again to an existing path is OK.
    pub fn node_publish(
        &self,
        req: NodePublishVolumeRequest,
    ) -> Result<NodePublishVolumeResponse, Status> {
        use volume_capability::AccessType;
        required("volume_id", &req.volume_id)?;
        required_path("target_path", &req.target_path)?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        let block = matches!(cap.access_type, Some(AccessType::Block(_)));
        let target = Path::new(&req.target_path);
        let created = if block {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(target)
                .map(drop)
        } else {
            match std::fs::create_dir(target) {
                Err(e) if e.kind() == ErrorKind::AlreadyExists && target.is_dir() => Ok(()),
                other => other,
            }
        };
        created.map_err(|e| {
            let status = if e.kind() == ErrorKind::NotFound {
                Status::failed_precondition
            } else {
                Status::internal
            };
            status(format!(
                "cannot create target_path {}: {e}; its parent directory must exist and be writable by the driver",
                target.display()
            ))
        })?;
        tracing::info!(volume_id = %req.volume_id, target_path = %target.display(), block, "NodePublishVolume: target path created");
        Ok(NodePublishVolumeResponse {})
    }

    /// NodeUnpublishVolume: removes the file or directory NodePublishVolume created; a path that
    /// is already gone is OK (the call is idempotent).
    pub fn node_unpublish(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Status> {
        required("volume_id", &req.volume_id)?;
        required_path("target_path", &req.target_path)?;
        if self.faults.misbehaves(Misbehaviour::KeepTargetPath) {
            return Ok(NodeUnpublishVolumeResponse {});
        }
        let target = Path::new(&req.target_path);
        let removed = match std::fs::symlink_metadata(target) {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
            // remove_dir, not remove_dir_all: nothing is mounted, so a non-empty directory is
            // someone else's data and is left alone with an error.
            Ok(m) if m.is_dir() => std::fs::remove_dir(target).map(|()| true),
            Ok(_) => std::fs::remove_file(target).map(|()| true),
        }
        .map_err(|e| {
            Status::internal(format!(
                "cannot remove target_path {}: {e}",
                target.display()
            ))
        })?;
        if removed {
            tracing::info!(volume_id = %req.volume_id, target_path = %target.display(), "NodeUnpublishVolume: target path removed");
        }
        Ok(NodeUnpublishVolumeResponse {})
    }
}

/// INVALID_ARGUMENT when a path field is empty. Not [`required`]: paths are not bound by the
/// 128-byte limit of names and ids, and a CO's temporary directories can be longer.
fn required_path(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(())
}
