//! The audit's reads: the driver's volumes (ListVolumes, paginated), PVs and claims (paged LISTs
//! or the sidecar's caches), the intent ledger, the PVs' last warnings; and the one write the audit
//! may make, DeleteVolume of leaked volumes (`--delete-orphans --confirm`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use super::{Deletion, Intent, Listing};
use crate::csi::CsiController;
use crate::csi::v1::{DeleteVolumeRequest, ListVolumesRequest};
use crate::provision::controller::intents::ledger::{LEDGER_LABEL, lease_entries};
use crate::retry::describe;

/// Volumes asked for per ListVolumes page.
const PAGE: i32 = 500;

/// Every volume id the driver lists, following `next_token`; `can_list` is the LIST_VOLUMES
/// capability (without it the driver is not asked, and the report says so).
pub(crate) async fn list_volumes(csi: &dyn CsiController, can_list: bool, driver: &str) -> Listing {
    if !can_list {
        return Listing::Unavailable(format!(
            "driver {driver} does not advertise the LIST_VOLUMES controller capability: leaked and lost volumes cannot be checked"
        ));
    }
    let mut ids = BTreeSet::new();
    let mut token = String::new();
    // A driver that keeps answering the same token would loop forever.
    let mut seen = BTreeSet::new();
    loop {
        let request = ListVolumesRequest {
            max_entries: PAGE,
            starting_token: token.clone(),
        };
        let page = match csi.list_volumes(request).await {
            Ok(page) => page,
            Err(status) => {
                return Listing::Unavailable(format!(
                    "ListVolumes failed: {} ({:?}); leaked and lost volumes were not checked",
                    status.message(),
                    status.code()
                ));
            }
        };
        for entry in page.entries {
            if let Some(volume) = entry.volume {
                ids.insert(volume.volume_id);
            }
        }
        if page.next_token.is_empty() {
            return Listing::Volumes(ids);
        }
        if !seen.insert(page.next_token.clone()) {
            return Listing::Unavailable(format!(
                "ListVolumes returned the page token {:?} twice; leaked and lost volumes were not checked",
                page.next_token
            ));
        }
        token = page.next_token;
    }
}

/// Every object of a kind, in pages of 500 (the audit runs once; no cache), stripped as the
/// caches strip them.
pub(crate) async fn list_all<K>(api: &Api<K>) -> Result<Vec<K>, String>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + 'static,
    K::DynamicType: Default,
{
    let mut all = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.map_err(|e| {
            format!(
                "listing {} failed: {}",
                K::plural(&Default::default()),
                describe(&e)
            )
        })?;
        all.extend(page.items.into_iter().map(|mut item| {
            crate::k8s::cache::strip(&mut item);
            item
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(all),
        }
    }
}

/// Every entry of the ledger `base` in `namespace`. A ledger that cannot be read is an error: its
/// entries may explain volumes without a PV.
pub(crate) async fn ledger_intents(
    client: &Client,
    namespace: &str,
    base: &str,
) -> Result<Vec<Intent>, String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{LEDGER_LABEL}={base}");
    let leases = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| {
            format!(
                "reading the intent ledger (Leases labelled {selector} in {namespace}) failed: {}; grant list on leases there, or pass the sidecar's --leader-election-namespace",
                describe(&e)
            )
        })?;
    let mut intents = Vec::new();
    for lease in leases.items {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let entries =
            lease_entries(&lease).map_err(|e| format!("Lease {namespace}/{name}: {e}"))?;
        intents.extend(entries.into_iter().map(|e| Intent {
            claim: e.claim_name(),
            volume: e.volume,
            uid: e.uid,
            volume_id: e.id,
            kept_in: "ledger",
        }));
    }
    Ok(intents)
}

/// The newest Warning event's message per PV among `pvs` (events about PVs live in `default`).
pub(crate) async fn last_warnings(client: &Client, pvs: &[String]) -> BTreeMap<String, String> {
    if pvs.is_empty() {
        return BTreeMap::new();
    }
    let api: Api<Event> =
        Api::namespaced(client.clone(), crate::names::EVENT_NAMESPACE_CLUSTER_SCOPED);
    let params = ListParams::default().fields("involvedObject.kind=PersistentVolume");
    let Ok(events) = api.list(&params).await else {
        return BTreeMap::new();
    };
    let wanted: BTreeSet<&str> = pvs.iter().map(String::as_str).collect();
    let mut newest: BTreeMap<String, (String, String)> = BTreeMap::new();
    for e in events.items {
        let name = e.involved_object.name.clone().unwrap_or_default();
        if e.type_.as_deref() != Some("Warning") || !wanted.contains(name.as_str()) {
            continue;
        }
        let at = e
            .last_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
            .unwrap_or_default();
        let text = format!(
            "{}: {}",
            e.reason.unwrap_or_default(),
            e.message.unwrap_or_default()
        );
        let slot = newest.entry(name).or_default();
        if at >= slot.0 {
            *slot = (at, text);
        }
    }
    newest
        .into_iter()
        .map(|(pv, (_, text))| (pv, text))
        .collect()
}

/// DeleteVolume for each leaked volume when `confirm`, else the dry-run line. No secrets: a leaked
/// volume has no PV or class to name them; a driver that needs them answers with its error.
pub(crate) async fn delete_orphans(
    csi: &dyn CsiController,
    leaked: &[String],
    confirm: bool,
) -> Vec<Deletion> {
    let mut done = Vec::new();
    for id in leaked {
        let outcome = if !confirm {
            "would delete (dry run: add --confirm)".to_owned()
        } else {
            let request = DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            };
            match csi.delete_volume(request, false).await {
                Ok(_) => "deleted".to_owned(),
                Err(status) => format!(
                    "DeleteVolume failed: {} ({:?})",
                    status.message(),
                    status.code()
                ),
            }
        };
        done.push(Deletion {
            volume_id: id.clone(),
            outcome,
        });
    }
    done
}
