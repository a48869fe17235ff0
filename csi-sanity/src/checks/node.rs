//! Node service checks that need a volume: the target path a driver creates on
//! NodePublishVolume and must remove on NodeUnpublishVolume.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::context::{Ctx, Failure, Verdict, describe, mount_capability};
use crate::csi::v1::*;
use crate::{ensure, fail};

/// A fresh directory for one check, in `--mount-dir` or the system's temporary directory.
/// It plays the CO's part: it exists (the spec makes the CO responsible for the parent of
/// target_path and for the staging path), the driver creates what goes inside.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new(ctx: &Ctx, what: &str) -> Result<WorkDir, Failure> {
        let base = ctx
            .opts
            .mount_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(ctx.name(what));
        std::fs::create_dir_all(dir.join("staging")).map_err(|e| {
            Failure::Fail(format!(
                "cannot create the check's directory {}: {e}; give a writable --mount-dir",
                dir.display()
            ))
        })?;
        Ok(WorkDir(dir))
    }

    fn target(&self) -> PathBuf {
        self.0.join("target")
    }

    fn staging(&self) -> PathBuf {
        self.0.join("staging")
    }

    /// Removes the directory with `remove_dir` only: something still mounted or left inside
    /// by the driver stays (and is reported) rather than being deleted with its data.
    fn remove(&self) -> Result<(), String> {
        for p in [self.target(), self.staging(), self.0.clone()] {
            match std::fs::remove_dir(&p) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) if p == self.target() && !p.is_dir() => {
                    // A block volume's target is a file.
                    std::fs::remove_file(&p)
                        .map_err(|_| format!("cannot remove {}: {e}", p.display()))?;
                }
                Err(e) => return Err(format!("cannot remove {}: {e}", p.display())),
                Ok(()) => {}
            }
        }
        Ok(())
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// What was set up before NodePublishVolume, to undo afterwards.
#[derive(Default)]
struct Published {
    controller: bool,
    staged: bool,
}

pub async fn target_path(ctx: &Ctx) -> Verdict {
    let node_id = match &ctx.node_info {
        Ok(info) => info.node_id.clone(),
        Err(e) => fail!("{e}"),
    };
    let volume = ctx.create_volume(ctx.volume_request("publish")).await?;
    let dir = WorkDir::new(ctx, "publish-dir")?;
    let mut done = Published::default();
    let outcome = publish_and_unpublish(ctx, &volume, &node_id, &dir, &mut done).await;
    let teardown = teardown(ctx, &volume.volume_id, &node_id, &dir, &done).await;
    match (outcome, teardown) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => fail!("cleanup failed: {e}"),
        (Ok(()), Ok(())) => Ok(()),
    }
}

async fn publish_and_unpublish(
    ctx: &Ctx,
    volume: &Volume,
    node_id: &str,
    dir: &WorkDir,
    done: &mut Published,
) -> Verdict {
    use controller_service_capability::rpc::Type as Rpc;
    use node_service_capability::rpc::Type as NodeRpc;
    let id = &volume.volume_id;
    let mut publish_context = HashMap::new();
    if ctx.has_rpc(Rpc::PublishUnpublishVolume) {
        let req = ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node_id.to_owned(),
            volume_capability: Some(mount_capability()),
            readonly: false,
            secrets: ctx.opts.secrets.get("ControllerPublishVolumeSecret"),
            volume_context: volume.volume_context.clone(),
        };
        publish_context = ctx
            .controller
            .clone()
            .controller_publish_volume(ctx.req(req))
            .await
            .map_err(|s| Failure::Fail(describe(&format!("ControllerPublishVolume {id}"), &s)))?
            .into_inner()
            .publish_context;
        done.controller = true;
    }
    if ctx.has_node_rpc(NodeRpc::StageUnstageVolume) {
        let req = NodeStageVolumeRequest {
            volume_id: id.clone(),
            publish_context: publish_context.clone(),
            staging_target_path: path_str(&dir.staging()),
            volume_capability: Some(mount_capability()),
            secrets: ctx.opts.secrets.get("NodeStageVolumeSecret"),
            volume_context: volume.volume_context.clone(),
        };
        ctx.node
            .clone()
            .node_stage_volume(ctx.req(req))
            .await
            .map_err(|s| Failure::Fail(describe(&format!("NodeStageVolume {id}"), &s)))?;
        done.staged = true;
    }
    let target = dir.target();
    let staged = ctx.has_node_rpc(NodeRpc::StageUnstageVolume);
    let req = NodePublishVolumeRequest {
        volume_id: id.clone(),
        publish_context,
        staging_target_path: if staged {
            path_str(&dir.staging())
        } else {
            String::new()
        },
        target_path: path_str(&target),
        volume_capability: Some(mount_capability()),
        readonly: false,
        secrets: ctx.opts.secrets.get("NodePublishVolumeSecret"),
        volume_context: volume.volume_context.clone(),
    };
    ctx.node
        .clone()
        .node_publish_volume(ctx.req(req))
        .await
        .map_err(|s| Failure::Fail(describe(&format!("NodePublishVolume {id}"), &s)))?;
    ensure!(
        std::fs::symlink_metadata(&target).is_ok(),
        "NodePublishVolume {id} answered OK, but target_path {} does not exist; creating it is the plugin's job",
        target.display()
    );
    unpublish(ctx, id, &target).await?;
    ensure!(
        std::fs::symlink_metadata(&target).is_err(),
        "NodeUnpublishVolume {id} answered OK, but target_path {} still exists; the spec requires the plugin to delete the file or directory it created there",
        target.display()
    );
    Ok(())
}

async fn unpublish(ctx: &Ctx, id: &str, target: &Path) -> Verdict {
    let req = NodeUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        target_path: path_str(target),
    };
    ctx.node
        .clone()
        .node_unpublish_volume(ctx.req(req))
        .await
        .map_err(|s| Failure::Fail(describe(&format!("NodeUnpublishVolume {id}"), &s)))?;
    Ok(())
}

/// Undoes what was set up, in reverse order, and removes the check's directory; returns every
/// step that failed.
async fn teardown(
    ctx: &Ctx,
    id: &str,
    node_id: &str,
    dir: &WorkDir,
    done: &Published,
) -> Result<(), String> {
    let mut errors = Vec::new();
    // Unpublish again in case the check stopped half-way; it is idempotent.
    if let Err(Failure::Fail(e) | Failure::Skip(e)) = unpublish(ctx, id, &dir.target()).await {
        errors.push(e);
    }
    if done.staged {
        let req = NodeUnstageVolumeRequest {
            volume_id: id.to_owned(),
            staging_target_path: path_str(&dir.staging()),
        };
        if let Err(s) = ctx.node.clone().node_unstage_volume(ctx.req(req)).await {
            errors.push(describe(&format!("NodeUnstageVolume {id}"), &s));
        }
    }
    if done.controller {
        let req = ControllerUnpublishVolumeRequest {
            volume_id: id.to_owned(),
            node_id: node_id.to_owned(),
            secrets: ctx.opts.secrets.get("ControllerUnpublishVolumeSecret"),
        };
        if let Err(s) = ctx
            .controller
            .clone()
            .controller_unpublish_volume(ctx.req(req))
            .await
        {
            errors.push(describe(&format!("ControllerUnpublishVolume {id}"), &s));
        }
    }
    if let Err(e) = dir.remove() {
        errors.push(e);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}
