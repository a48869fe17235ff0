//! Snapshot checks (create, idempotency, conflicts, delete, list) and volumes created from a
//! snapshot or another volume (the provisioner requires `content_source` in the response).

use tonic::Code;

use crate::context::{Ctx, Failure, Verdict, describe, expect_code};
use crate::csi::v1::*;
use crate::{ensure, fail};

use volume_content_source::{SnapshotSource, Type as Source, VolumeSource};

pub async fn basic(ctx: &Ctx) -> Verdict {
    let v = ctx.create_volume(ctx.volume_request("snap-src")).await?;
    let name = ctx.name("snap");
    let s = ctx.create_snapshot(&v.volume_id, &name).await?;
    ensure!(
        s.source_volume_id == v.volume_id,
        "CreateSnapshot {name}: source_volume_id is {:?}, want {:?}",
        s.source_volume_id,
        v.volume_id
    );
    ensure!(
        s.creation_time.is_some(),
        "CreateSnapshot {name}: creation_time is missing; the spec requires it"
    );
    ensure!(
        s.size_bytes >= 0,
        "CreateSnapshot {name}: size_bytes is negative ({})",
        s.size_bytes
    );
    ctx.try_delete_snapshot(&s.snapshot_id)
        .await
        .map_err(|st| Failure::Fail(describe(&format!("DeleteSnapshot {}", s.snapshot_id), &st)))
}

pub async fn idempotent(ctx: &Ctx) -> Verdict {
    let v = ctx.create_volume(ctx.volume_request("snap-src")).await?;
    let name = ctx.name("snap");
    let first = ctx.create_snapshot(&v.volume_id, &name).await?;
    let second = ctx.create_snapshot(&v.volume_id, &name).await?;
    ensure!(
        first.snapshot_id == second.snapshot_id,
        "CreateSnapshot {name} twice returned two snapshots ({} and {})",
        first.snapshot_id,
        second.snapshot_id
    );
    Ok(())
}

pub async fn name_conflict(ctx: &Ctx) -> Verdict {
    let a = ctx.create_volume(ctx.volume_request("snap-src")).await?;
    let b = ctx.create_volume(ctx.volume_request("snap-src")).await?;
    let name = ctx.name("snap");
    ctx.create_snapshot(&a.volume_id, &name).await?;
    let got = ctx.try_create_snapshot(&b.volume_id, &name).await;
    expect_code(
        "CreateSnapshot with an existing name and another source volume",
        got,
        &[Code::AlreadyExists],
    )
}

pub async fn missing_fields(ctx: &Ctx) -> Verdict {
    // A real source, so only the missing name can be wrong.
    let v = ctx.create_volume(ctx.volume_request("snap-src")).await?;
    let got = ctx.try_create_snapshot(&v.volume_id, "").await;
    expect_code(
        "CreateSnapshot without a name",
        got,
        &[Code::InvalidArgument],
    )?;
    let got = ctx.try_create_snapshot("", &ctx.name("snap")).await;
    expect_code(
        "CreateSnapshot without a source_volume_id",
        got,
        &[Code::InvalidArgument],
    )
}

pub async fn delete_missing_id(ctx: &Ctx) -> Verdict {
    let req = DeleteSnapshotRequest {
        snapshot_id: String::new(),
        secrets: ctx.opts.secrets.get("DeleteSnapshotSecret"),
    };
    let got = ctx.controller.clone().delete_snapshot(ctx.req(req)).await;
    expect_code(
        "DeleteSnapshot without a snapshot id",
        got,
        &[Code::InvalidArgument],
    )
}

pub async fn delete_unknown_id(ctx: &Ctx) -> Verdict {
    let id = ctx.name("unknown-snapshot-id");
    ctx.try_delete_snapshot(&id).await.map_err(|s| {
        Failure::Fail(format!(
            "{}; the spec requires OK for a snapshot that does not exist",
            describe(&format!("DeleteSnapshot {id}"), &s)
        ))
    })
}

pub async fn listed(ctx: &Ctx) -> Verdict {
    let v = ctx.create_volume(ctx.volume_request("snap-src")).await?;
    let s = ctx.create_snapshot(&v.volume_id, &ctx.name("snap")).await?;
    let list = |req: ListSnapshotsRequest| async move {
        ctx.controller
            .clone()
            .list_snapshots(ctx.req(req))
            .await
            .map(|r| {
                r.into_inner()
                    .entries
                    .into_iter()
                    .filter_map(|e| e.snapshot)
                    .map(|s| s.snapshot_id)
                    .collect::<Vec<_>>()
            })
            .map_err(|st| Failure::Fail(describe("ListSnapshots", &st)))
    };
    let secrets = ctx.opts.secrets.get("ListSnapshotsSecret");
    let by_id = list(ListSnapshotsRequest {
        snapshot_id: s.snapshot_id.clone(),
        secrets: secrets.clone(),
        ..Default::default()
    })
    .await?;
    ensure!(
        by_id == vec![s.snapshot_id.clone()],
        "ListSnapshots with snapshot_id {} returned {by_id:?}, want exactly that snapshot",
        s.snapshot_id
    );
    let by_source = list(ListSnapshotsRequest {
        source_volume_id: v.volume_id.clone(),
        secrets,
        ..Default::default()
    })
    .await?;
    ensure!(
        by_source.contains(&s.snapshot_id),
        "ListSnapshots with source_volume_id {} does not return snapshot {}",
        v.volume_id,
        s.snapshot_id
    );
    Ok(())
}

pub async fn invalid_token(ctx: &Ctx) -> Verdict {
    let req = ListSnapshotsRequest {
        starting_token: ctx.name("invalid-token"),
        secrets: ctx.opts.secrets.get("ListSnapshotsSecret"),
        ..Default::default()
    };
    let got = ctx.controller.clone().list_snapshots(ctx.req(req)).await;
    expect_code(
        "ListSnapshots with an invalid starting_token",
        got,
        &[Code::Aborted],
    )
}

fn from_source(ctx: &Ctx, what: &str, source: Source) -> CreateVolumeRequest {
    let mut req = ctx.volume_request(what);
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(source),
    });
    req
}

fn expect_source(v: &Volume, want: &Source) -> Verdict {
    let got = v.content_source.as_ref().and_then(|s| s.r#type.as_ref());
    match got {
        Some(got) if got == want => Ok(()),
        None => fail!(
            "volume {} was created from {want:?} but the response has no content_source; the provisioner deletes such volumes",
            v.volume_id
        ),
        Some(got) => fail!(
            "volume {} reports content_source {got:?}, want {want:?}",
            v.volume_id
        ),
    }
}

pub async fn restore(ctx: &Ctx) -> Verdict {
    let src = ctx.create_volume(ctx.volume_request("snap-src")).await?;
    let snap = ctx
        .create_snapshot(&src.volume_id, &ctx.name("snap"))
        .await?;
    let source = Source::Snapshot(SnapshotSource {
        snapshot_id: snap.snapshot_id.clone(),
    });
    let v = ctx
        .create_volume(from_source(ctx, "restore", source.clone()))
        .await?;
    expect_source(&v, &source)?;
    ensure!(
        v.capacity_bytes == 0 || v.capacity_bytes >= snap.size_bytes,
        "volume {} restored from a {}-byte snapshot has only {} bytes",
        v.volume_id,
        snap.size_bytes,
        v.capacity_bytes
    );
    Ok(())
}

pub async fn restore_missing(ctx: &Ctx) -> Verdict {
    let source = Source::Snapshot(SnapshotSource {
        snapshot_id: ctx.name("unknown-snapshot-id"),
    });
    let got = ctx
        .try_create_volume(from_source(ctx, "restore", source))
        .await;
    expect_code(
        "CreateVolume from a snapshot that does not exist",
        got,
        &[Code::NotFound],
    )
}

pub async fn clone(ctx: &Ctx) -> Verdict {
    let src = ctx.create_volume(ctx.volume_request("clone-src")).await?;
    let source = Source::Volume(VolumeSource {
        volume_id: src.volume_id.clone(),
    });
    let v = ctx
        .create_volume(from_source(ctx, "clone", source.clone()))
        .await?;
    expect_source(&v, &source)
}

pub async fn clone_missing(ctx: &Ctx) -> Verdict {
    let source = Source::Volume(VolumeSource {
        volume_id: ctx.name("unknown-volume-id"),
    });
    let got = ctx
        .try_create_volume(from_source(ctx, "clone", source))
        .await;
    expect_code(
        "CreateVolume from a volume that does not exist",
        got,
        &[Code::NotFound],
    )
}
