//! Identity checks (plugin info, capabilities, probe) and the controller capability check.

use crate::context::{Ctx, Failure, Verdict, describe};
use crate::csi::v1::*;
use crate::{ensure, fail};

/// The CSI rule for plugin names: domain-name-like, at most 63 characters.
pub fn valid_plugin_name(name: &str) -> bool {
    let b = name.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    b.len() <= 63
        && first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'.')
}

pub async fn plugin_info(ctx: &Ctx) -> Verdict {
    let info = ctx
        .identity
        .clone()
        .get_plugin_info(ctx.req(GetPluginInfoRequest {}))
        .await
        .map_err(|s| Failure::Fail(describe("GetPluginInfo", &s)))?
        .into_inner();
    ensure!(
        valid_plugin_name(&info.name),
        "GetPluginInfo name {:?} breaks the CSI rule: 1-63 characters, alphanumeric at both ends, only '-', '.' and alphanumerics between",
        info.name
    );
    ensure!(
        !info.vendor_version.is_empty(),
        "GetPluginInfo vendor_version is empty; the CSI spec requires it"
    );
    Ok(())
}

pub async fn plugin_capabilities(ctx: &Ctx) -> Verdict {
    let caps = ctx
        .identity
        .clone()
        .get_plugin_capabilities(ctx.req(GetPluginCapabilitiesRequest {}))
        .await
        .map_err(|s| Failure::Fail(describe("GetPluginCapabilities", &s)))?
        .into_inner();
    for (i, c) in caps.capabilities.iter().enumerate() {
        match &c.r#type {
            None => fail!("GetPluginCapabilities capability {i} has no type"),
            Some(plugin_capability::Type::Service(s)) if s.r#type == 0 => {
                fail!("GetPluginCapabilities capability {i} is service UNKNOWN")
            }
            Some(plugin_capability::Type::VolumeExpansion(e)) if e.r#type == 0 => {
                fail!("GetPluginCapabilities capability {i} is volume expansion UNKNOWN")
            }
            Some(_) => {}
        }
    }
    Ok(())
}

pub async fn probe(ctx: &Ctx) -> Verdict {
    ctx.wait_ready().await.map_err(Failure::Fail)
}

pub async fn controller_capabilities(ctx: &Ctx) -> Verdict {
    use controller_service_capability::rpc::Type;
    if let Err(e) = &ctx.plugin_caps {
        fail!("cannot tell whether the controller service is offered: {e}");
    }
    ensure!(
        ctx.has_service(plugin_capability::service::Type::ControllerService),
        "GetPluginCapabilities does not report CONTROLLER_SERVICE; the provisioner refuses such drivers"
    );
    let caps = ctx
        .controller_caps
        .as_ref()
        .map_err(|e| Failure::Fail(e.clone()))?;
    if let Some(i) = caps.iter().position(|t| *t == Type::Unknown as i32) {
        fail!("ControllerGetCapabilities capability {i} is UNKNOWN");
    }
    ensure!(
        ctx.has_rpc(Type::CreateDeleteVolume),
        "ControllerGetCapabilities does not report CREATE_DELETE_VOLUME; the provisioner refuses such drivers"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn plugin_names_follow_the_csi_rule() {
        assert!(super::valid_plugin_name("hostpath.csi.k8s.io"));
        assert!(!super::valid_plugin_name("Bad_Name"));
        assert!(!super::valid_plugin_name(".starts-with-dot"));
        assert!(!super::valid_plugin_name(""));
    }
}
