//! Which intent ledger this instance writes (the driver's; in node mode its node's), and reading
//! another node's ledger before clearing a claim's selected node.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The intent ledger of this driver, in the leader-election namespace (where upstream's Role
/// grants Leases). Node mode: one ledger per node, written only by that node's instance, and
/// finished by the dead-node clean-up when the node is gone (`gone_nodes::ledgers`).
pub(super) async fn open_ledger(ctx: &Context) -> Ledger {
    let namespace = crate::leader::ledger_namespace(&ctx.config);
    let node = ctx
        .config
        .node_deployment
        .as_ref()
        .map(|n| n.node_name.as_str());
    let base = ledger_base(ctx, node);
    Ledger::open(
        ctx.client.clone(),
        &namespace,
        &base,
        node,
        ctx.bucket.clone(),
        ctx.metrics.backlog.ledger_intents.clone(),
    )
    .await
}

/// The volume name node `node`'s intent ledger holds for `pvc` (same UID), if any.
pub(super) async fn in_node_ledger(
    state: &Provisioner,
    pvc: &PersistentVolumeClaim,
    node: &str,
) -> Result<Option<String>, ProvisionError> {
    let ctx = &state.ctx;
    let namespace = crate::leader::ledger_namespace(&ctx.config);
    let base = ledger_base(ctx, Some(node));
    let entries = crate::provision::ledger::lease::read_ledger(&ctx.client, &namespace, &base)
        .await
        .map_err(kube_err(format!(
            "reading the intent ledger of node {node}"
        )))?;
    let uid = pvc.metadata.uid.as_deref().unwrap_or_default();
    Ok(entries.into_iter().find(|e| e.uid == uid).map(|e| e.volume))
}

/// The ledger's name: the driver's Lease name; in node mode with the node's hash.
fn ledger_base(ctx: &Context, node: Option<&str>) -> String {
    let lease = crate::leader::decide::lease_name(&ctx.driver.name);
    match node {
        Some(node) => crate::provision::ledger::node_ledger_base(&lease, node),
        None => lease,
    }
}
