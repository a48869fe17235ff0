//! ListVolumes (presence, pagination, bad tokens) and GetCapacity checks.

use tonic::Code;

use crate::context::{Ctx, Failure, Verdict, describe, expect_code, mount_capability};
use crate::csi::v1::*;
use crate::{ensure, fail};

/// Volumes created for the pagination walk; with pages of 2 this needs at least three pages.
const PAGINATION_VOLUMES: usize = 5;

pub async fn created_and_deleted(ctx: &Ctx) -> Verdict {
    let v = ctx.create_volume(ctx.volume_request("listed")).await?;
    let ids = ctx.list_all_volumes(0).await?;
    ensure!(
        ids.contains(&v.volume_id),
        "ListVolumes does not list the volume {} just created",
        v.volume_id
    );
    ctx.delete_volume(&v.volume_id).await?;
    let ids = ctx.list_all_volumes(0).await?;
    ensure!(
        !ids.contains(&v.volume_id),
        "ListVolumes still lists volume {} after DeleteVolume",
        v.volume_id
    );
    Ok(())
}

pub async fn pagination(ctx: &Ctx) -> Verdict {
    let mut created = Vec::new();
    for _ in 0..PAGINATION_VOLUMES {
        created.push(
            ctx.create_volume(ctx.volume_request("page"))
                .await?
                .volume_id,
        );
    }
    let ids = ctx.list_all_volumes(2).await?;
    for id in &created {
        match ids.iter().filter(|x| *x == id).count() {
            1 => {}
            0 => fail!(
                "walking ListVolumes with max_entries=2 never returned volume {id} ({} entries seen)",
                ids.len()
            ),
            n => fail!("walking ListVolumes with max_entries=2 returned volume {id} {n} times"),
        }
    }
    Ok(())
}

pub async fn invalid_token(ctx: &Ctx) -> Verdict {
    let req = ListVolumesRequest {
        max_entries: 0,
        starting_token: ctx.name("invalid-token"),
    };
    let got = ctx.controller.clone().list_volumes(ctx.req(req)).await;
    expect_code(
        "ListVolumes with an invalid starting_token",
        got,
        &[Code::Aborted],
    )
}

fn check_capacity_response(what: &str, r: &GetCapacityResponse) -> Verdict {
    ensure!(
        r.available_capacity >= 0,
        "{what}: available_capacity is negative ({})",
        r.available_capacity
    );
    if let Some(max) = r.maximum_volume_size {
        ensure!(max >= 0, "{what}: maximum_volume_size is negative ({max})");
    }
    if let Some(min) = r.minimum_volume_size {
        ensure!(min >= 0, "{what}: minimum_volume_size is negative ({min})");
    }
    Ok(())
}

pub async fn get_capacity(ctx: &Ctx) -> Verdict {
    let call = |req: GetCapacityRequest| async move {
        ctx.controller
            .clone()
            .get_capacity(ctx.req(req))
            .await
            .map(tonic::Response::into_inner)
    };
    let all = call(GetCapacityRequest::default())
        .await
        .map_err(|s| Failure::Fail(describe("GetCapacity", &s)))?;
    check_capacity_response("GetCapacity", &all)?;
    let with_params = GetCapacityRequest {
        volume_capabilities: vec![mount_capability()],
        parameters: ctx.opts.test_volume_parameters.clone(),
        accessible_topology: None,
    };
    let r = call(with_params)
        .await
        .map_err(|s| Failure::Fail(describe("GetCapacity with test parameters", &s)))?;
    check_capacity_response("GetCapacity with test parameters", &r)?;
    // The provisioner's capacity tracking asks per topology segment.
    if let Some(topology) = ctx.node_topology() {
        let segments = format!("{:?}", topology.segments);
        let per_segment = GetCapacityRequest {
            accessible_topology: Some(topology),
            ..Default::default()
        };
        let r = call(per_segment).await.map_err(|s| {
            Failure::Fail(describe(&format!("GetCapacity for segment {segments}"), &s))
        })?;
        check_capacity_response(&format!("GetCapacity for segment {segments}"), &r)?;
    }
    Ok(())
}
