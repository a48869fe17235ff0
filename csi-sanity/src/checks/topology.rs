//! NodeGetInfo and topology-aware CreateVolume checks.

use crate::context::{Ctx, Failure, Verdict};
use crate::csi::v1::*;
use crate::{ensure, fail};

pub async fn node_info(ctx: &Ctx) -> Verdict {
    let info = ctx
        .node_info
        .as_ref()
        .map_err(|e| Failure::Fail(e.clone()))?;
    ensure!(
        !info.node_id.is_empty(),
        "NodeGetInfo node_id is empty; the spec requires it"
    );
    ensure!(
        info.max_volumes_per_node >= 0,
        "NodeGetInfo max_volumes_per_node is negative ({})",
        info.max_volumes_per_node
    );
    if ctx.has_service(plugin_capability::service::Type::VolumeAccessibilityConstraints) {
        match &info.accessible_topology {
            Some(t) if !t.segments.is_empty() => {}
            _ => fail!(
                "the driver advertises VOLUME_ACCESSIBILITY_CONSTRAINTS but NodeGetInfo reports no accessible_topology; the provisioner cannot build topology requirements"
            ),
        }
    }
    Ok(())
}

pub async fn create_in_topology(ctx: &Ctx) -> Verdict {
    let Some(node) = ctx.node_topology() else {
        return Err(Failure::Skip(
            "NodeGetInfo reports no accessible_topology".into(),
        ));
    };
    // volume_request already asks for the node's topology, as the provisioner would.
    let req = ctx.volume_request("topology");
    let v = ctx.create_volume(req).await?;
    ensure!(
        !v.accessible_topology.is_empty(),
        "volume {} has no accessible_topology although the driver advertises VOLUME_ACCESSIBILITY_CONSTRAINTS; the provisioner could not set node affinity",
        v.volume_id
    );
    ensure!(
        v.accessible_topology.iter().any(|t| within(t, &node)),
        "volume {} is accessible from {:?}, none of which covers the requisite segment {:?}",
        v.volume_id,
        v.accessible_topology
            .iter()
            .map(|t| &t.segments)
            .collect::<Vec<_>>(),
        node.segments
    );
    Ok(())
}

/// Whether a volume accessible from `volume` is reachable from the requisite segment `term`:
/// every key of `volume` has the term's value (a broader segment, e.g. the zone of a
/// zone+node term, qualifies).
fn within(volume: &Topology, term: &Topology) -> bool {
    !volume.segments.is_empty()
        && volume
            .segments
            .iter()
            .all(|(k, v)| term.segments.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(pairs: &[(&str, &str)]) -> Topology {
        Topology {
            segments: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn a_volume_segment_must_equal_or_contain_the_requisite_term() {
        let term = t(&[("zone", "z1"), ("node", "n1")]);
        assert!(within(&t(&[("zone", "z1"), ("node", "n1")]), &term));
        assert!(within(&t(&[("zone", "z1")]), &term));
        assert!(!within(&t(&[("zone", "z2")]), &term));
        assert!(!within(&t(&[("zone", "z1"), ("rack", "r1")]), &term));
        assert!(!within(&t(&[]), &term));
    }
}
