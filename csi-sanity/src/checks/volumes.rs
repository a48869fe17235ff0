//! CreateVolume / DeleteVolume / ControllerModifyVolume checks: required fields, idempotency,
//! capacity ranges, secrets, mutable parameters.

use std::collections::HashMap;

use tonic::Code;

use crate::context::{Ctx, Failure, Verdict, describe, expect_code};
use crate::csi::v1::*;
use crate::{ensure, fail};

/// A mutable parameter no driver supports: a driver must refuse it rather than ignore it, or a
/// VolumeAttributesClass with a typo would seem to apply.
const UNSUPPORTED_MUTABLE_PARAMETER: (&str, &str) = (
    "csi-sanity-unsupported-mutable-parameter",
    "csi-sanity-value",
);

fn unsupported_mutable_parameters() -> HashMap<String, String> {
    let (k, v) = UNSUPPORTED_MUTABLE_PARAMETER;
    HashMap::from([(k.to_owned(), v.to_owned())])
}

/// Codes a driver may use to reject a call without its secrets.
const SECRET_REJECTIONS: &[Code] = &[
    Code::Unauthenticated,
    Code::PermissionDenied,
    Code::InvalidArgument,
];

fn check_capacity(v: &Volume, required: i64, limit: i64) -> Verdict {
    // 0 means "unknown" (e.g. NFS); the provisioner then uses the requested size.
    if v.capacity_bytes == 0 {
        return Ok(());
    }
    ensure!(
        v.capacity_bytes >= required,
        "volume {} has capacity_bytes {}, less than required_bytes {required}; the provisioner would delete it again",
        v.volume_id,
        v.capacity_bytes
    );
    ensure!(
        limit == 0 || v.capacity_bytes <= limit,
        "volume {} has capacity_bytes {}, more than limit_bytes {limit}",
        v.volume_id,
        v.capacity_bytes
    );
    Ok(())
}

pub async fn basic(ctx: &Ctx) -> Verdict {
    let req = ctx.volume_request("basic");
    let v = ctx.create_volume(req).await?;
    ensure!(
        v.capacity_bytes >= 0,
        "volume {} has negative capacity_bytes {}",
        v.volume_id,
        v.capacity_bytes
    );
    check_capacity(&v, ctx.opts.test_volume_size, 0)?;
    ctx.delete_volume(&v.volume_id).await
}

pub async fn missing_name(ctx: &Ctx) -> Verdict {
    let mut req = ctx.volume_request("noname");
    req.name.clear();
    let got = ctx.try_create_volume(req).await;
    expect_code("CreateVolume without a name", got, &[Code::InvalidArgument])
}

pub async fn missing_capabilities(ctx: &Ctx) -> Verdict {
    let mut req = ctx.volume_request("nocaps");
    req.volume_capabilities.clear();
    let got = ctx.try_create_volume(req).await;
    expect_code(
        "CreateVolume without volume_capabilities",
        got,
        &[Code::InvalidArgument],
    )
}

pub async fn idempotent(ctx: &Ctx) -> Verdict {
    let req = ctx.volume_request("idem");
    let first = ctx.create_volume(req.clone()).await?;
    let second = ctx.create_volume(req.clone()).await?;
    ensure!(
        first.volume_id == second.volume_id,
        "CreateVolume {} twice returned two volumes ({} and {}); the spec requires the same volume",
        req.name,
        first.volume_id,
        second.volume_id
    );
    ensure!(
        first.capacity_bytes == second.capacity_bytes,
        "CreateVolume {} twice returned capacities {} and {}",
        req.name,
        first.capacity_bytes,
        second.capacity_bytes
    );
    Ok(())
}

pub async fn incompatible_size(ctx: &Ctx) -> Verdict {
    let req = ctx.volume_request("conflict");
    let first = ctx.create_volume(req.clone()).await?;
    // An exact range the first volume cannot satisfy, whatever the driver rounded it to.
    let base = if first.capacity_bytes > 0 {
        first.capacity_bytes
    } else {
        ctx.opts.test_volume_size
    };
    let mut bigger = req;
    bigger.capacity_range = Some(CapacityRange {
        required_bytes: base * 2,
        limit_bytes: base * 2,
    });
    let got = ctx.try_create_volume(bigger).await;
    expect_code(
        "CreateVolume with an existing name and a different size",
        got,
        &[Code::AlreadyExists],
    )
}

pub async fn exact_capacity(ctx: &Ctx) -> Verdict {
    let size = ctx.opts.test_volume_size;
    let mut req = ctx.volume_request("exact");
    req.capacity_range = Some(CapacityRange {
        required_bytes: size,
        limit_bytes: size,
    });
    match ctx.try_create_volume(req).await {
        Ok(v) => check_capacity(&v, size, size),
        Err(s) if s.code() == Code::OutOfRange => Ok(()),
        Err(s) => fail!(
            "{}",
            describe("CreateVolume with required_bytes = limit_bytes", &s)
        ),
    }
}

pub async fn required_above_limit(ctx: &Ctx) -> Verdict {
    let size = ctx.opts.test_volume_size;
    let mut req = ctx.volume_request("inverted");
    req.capacity_range = Some(CapacityRange {
        required_bytes: size,
        limit_bytes: size / 2,
    });
    let got = ctx.try_create_volume(req).await;
    expect_code(
        "CreateVolume with required_bytes > limit_bytes",
        got,
        &[Code::InvalidArgument, Code::OutOfRange],
    )
}

pub async fn above_maximum(ctx: &Ctx) -> Verdict {
    let cap = ctx
        .controller
        .clone()
        .get_capacity(ctx.req(GetCapacityRequest {
            volume_capabilities: vec![crate::context::mount_capability()],
            parameters: ctx.opts.test_volume_parameters.clone(),
            accessible_topology: ctx.node_topology(),
        }))
        .await
        .map_err(|s| Failure::Fail(describe("GetCapacity", &s)))?
        .into_inner();
    let Some(max) = cap.maximum_volume_size.filter(|m| *m > 0 && *m < i64::MAX) else {
        return Err(Failure::Skip(
            "GetCapacity reports no maximum_volume_size".into(),
        ));
    };
    let mut req = ctx.volume_request("toobig");
    req.capacity_range = Some(CapacityRange {
        required_bytes: max + 1,
        limit_bytes: 0,
    });
    let got = ctx.try_create_volume(req).await;
    expect_code(
        &format!(
            "CreateVolume of {} bytes (maximum_volume_size {max})",
            max + 1
        ),
        got,
        &[Code::OutOfRange],
    )
}

pub async fn create_without_secrets(ctx: &Ctx) -> Verdict {
    let mut req = ctx.volume_request("nosecret");
    req.secrets = HashMap::new();
    match ctx.try_create_volume(req).await {
        Ok(_) => Err(Failure::Skip(
            "the driver accepts CreateVolume without secrets".into(),
        )),
        Err(s) => expect_code::<()>(
            "CreateVolume without the configured secrets",
            Err(s),
            SECRET_REJECTIONS,
        ),
    }
}

pub async fn delete_missing_id(ctx: &Ctx) -> Verdict {
    let req = DeleteVolumeRequest {
        volume_id: String::new(),
        secrets: ctx.opts.secrets.get("DeleteVolumeSecret"),
    };
    let got = ctx.controller.clone().delete_volume(ctx.req(req)).await;
    expect_code(
        "DeleteVolume without a volume id",
        got,
        &[Code::InvalidArgument],
    )
}

pub async fn delete_unknown_id(ctx: &Ctx) -> Verdict {
    let id = ctx.name("unknown-volume-id");
    ctx.try_delete_volume(&id).await.map_err(|s| {
        Failure::Fail(format!(
            "{}; the spec requires OK for a volume that does not exist",
            describe(&format!("DeleteVolume {id}"), &s)
        ))
    })
}

pub async fn delete_idempotent(ctx: &Ctx) -> Verdict {
    let v = ctx.create_volume(ctx.volume_request("del-twice")).await?;
    ctx.delete_volume(&v.volume_id).await?;
    ctx.try_delete_volume(&v.volume_id).await.map_err(|s| {
        Failure::Fail(format!(
            "{}; a repeated DeleteVolume must be OK",
            describe(&format!("second DeleteVolume {}", v.volume_id), &s)
        ))
    })
}

pub async fn delete_without_secrets(ctx: &Ctx) -> Verdict {
    let v = ctx
        .create_volume(ctx.volume_request("del-nosecret"))
        .await?;
    let req = DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        secrets: HashMap::new(),
    };
    match ctx.controller.clone().delete_volume(ctx.req(req)).await {
        Ok(_) => Err(Failure::Skip(
            "the driver accepts DeleteVolume without secrets".into(),
        )),
        Err(s) => expect_code::<()>(
            "DeleteVolume without the configured secrets",
            Err(s),
            SECRET_REJECTIONS,
        ),
    }
}

fn modify_request(
    ctx: &Ctx,
    volume_id: &str,
    mutable_parameters: HashMap<String, String>,
) -> ControllerModifyVolumeRequest {
    ControllerModifyVolumeRequest {
        volume_id: volume_id.to_owned(),
        secrets: ctx.opts.secrets.get("ControllerModifyVolumeSecret"),
        mutable_parameters,
    }
}

/// A volume created with the test mutable parameters (a claim with a VolumeAttributesClass).
async fn create_with_mutable_parameters(ctx: &Ctx, what: &str) -> Result<Volume, Failure> {
    let mut req = ctx.volume_request(what);
    req.mutable_parameters = ctx.opts.test_volume_mutable_parameters.clone();
    ctx.create_volume(req).await
}

async fn modify_must_succeed(ctx: &Ctx, volume_id: &str) -> Verdict {
    let req = modify_request(
        ctx,
        volume_id,
        ctx.opts.test_volume_mutable_parameters.clone(),
    );
    ctx.controller
        .clone()
        .controller_modify_volume(ctx.req(req))
        .await
        .map_err(|s| Failure::Fail(describe(&format!("ControllerModifyVolume {volume_id}"), &s)))?;
    Ok(())
}

async fn modify_must_refuse_unsupported(ctx: &Ctx, volume_id: &str) -> Verdict {
    let req = modify_request(ctx, volume_id, unsupported_mutable_parameters());
    let got = ctx
        .controller
        .clone()
        .controller_modify_volume(ctx.req(req))
        .await;
    expect_code(
        &format!(
            "ControllerModifyVolume {volume_id} with the unsupported mutable parameter {}",
            UNSUPPORTED_MUTABLE_PARAMETER.0
        ),
        got,
        &[Code::InvalidArgument],
    )
}

pub async fn create_with_mutable(ctx: &Ctx) -> Verdict {
    create_with_mutable_parameters(ctx, "vac").await.map(drop)
}

pub async fn create_with_unsupported_mutable(ctx: &Ctx) -> Verdict {
    let mut req = ctx.volume_request("bad-vac");
    req.mutable_parameters = unsupported_mutable_parameters();
    let got = ctx.try_create_volume(req).await;
    expect_code(
        &format!(
            "CreateVolume with the unsupported mutable parameter {}",
            UNSUPPORTED_MUTABLE_PARAMETER.0
        ),
        got,
        &[Code::InvalidArgument],
    )
}

pub async fn modify_missing_id(ctx: &Ctx) -> Verdict {
    let req = modify_request(ctx, "", ctx.opts.test_volume_mutable_parameters.clone());
    let got = ctx
        .controller
        .clone()
        .controller_modify_volume(ctx.req(req))
        .await;
    expect_code(
        "ControllerModifyVolume without a volume id",
        got,
        &[Code::InvalidArgument],
    )
}

/// Sends the test mutable parameters, possibly none: whatever the parameters, a volume that
/// does not exist is NOT_FOUND (an answer about the parameters would send the caller after
/// the wrong problem).
pub async fn modify_unknown(ctx: &Ctx) -> Verdict {
    let req = modify_request(
        ctx,
        &ctx.name("unknown-volume-id"),
        ctx.opts.test_volume_mutable_parameters.clone(),
    );
    let got = ctx
        .controller
        .clone()
        .controller_modify_volume(ctx.req(req))
        .await;
    expect_code(
        "ControllerModifyVolume of a volume that does not exist",
        got,
        &[Code::NotFound],
    )
}

pub async fn modify_unsupported(ctx: &Ctx) -> Verdict {
    let v = ctx.create_volume(ctx.volume_request("modify-bad")).await?;
    modify_must_refuse_unsupported(ctx, &v.volume_id).await
}

pub async fn modify_basic(ctx: &Ctx) -> Verdict {
    let v = ctx.create_volume(ctx.volume_request("modify")).await?;
    modify_must_succeed(ctx, &v.volume_id).await
}

pub async fn modify_created_with_parameters(ctx: &Ctx) -> Verdict {
    let v = create_with_mutable_parameters(ctx, "vac-modify").await?;
    modify_must_succeed(ctx, &v.volume_id).await
}

pub async fn modify_created_with_parameters_unsupported(ctx: &Ctx) -> Verdict {
    let v = create_with_mutable_parameters(ctx, "vac-modify-bad").await?;
    modify_must_refuse_unsupported(ctx, &v.volume_id).await
}
