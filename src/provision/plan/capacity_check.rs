//! Node mode, immediate binding: before an instance competes for an unselected claim, it asks its
//! own driver whether the claim fits (upstream `checkCapacity` in `becomeOwner`), so a full node
//! does not win a claim it cannot serve while another node could.
//!
//! As upstream: the requests are what CreateVolume would carry if this node were selected (volume
//! capabilities, parameters, each requisite topology or none); a claim asking for 0 bytes, or one
//! whose request cannot be built, is not checked; one topology with `available_capacity >=
//! required` is enough; a failed GetCapacity does not stop the instance from competing (the
//! driver answers CreateVolume anyway). Unlike upstream, building the requests has no side effect
//! (upstream's `prepareProvision` may add the clone and snapshot finalizers from this path), and
//! a driver without `GET_CAPACITY` is not asked.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use super::{Facts, ProvisionSettings, Stop, plan};
use crate::csi::v1::{GetCapacityRequest, Topology};
use crate::names;
use crate::provision::source::SourceToRead;

/// The GetCapacity requests to send before competing for a claim.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CapacityCheck {
    /// Bytes the claim asks for (`capacity_range.required_bytes` of the CreateVolume to come).
    pub(crate) required_bytes: i64,
    /// One per requisite topology (this node's segments), or one without topology.
    pub(crate) requests: Vec<GetCapacityRequest>,
}

/// The check for `pvc` if this instance (`me`) were selected; `None` when there is nothing to ask.
/// `Err`: the request needs the data source, which the shell has not read yet.
pub(super) fn capacity_check(
    pvc: &PersistentVolumeClaim,
    settings: &ProvisionSettings,
    facts: &Facts,
    class: &StorageClass,
    me: &str,
) -> Result<Option<CapacityCheck>, SourceToRead> {
    if !settings.controller.get_capacity {
        return Ok(None);
    }
    let mut as_ours = pvc.clone();
    as_ours
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(names::ANN_SELECTED_NODE.to_owned(), me.to_owned());
    // An error here comes back as the claim's ProvisioningFailed once this node has it.
    let request = match plan(&as_ours, settings, facts, class) {
        Ok(plan) => plan.request,
        Err(Stop::ReadSource(unread)) => return Err(unread.0),
        Err(_) => return Ok(None),
    };
    let required_bytes = request
        .capacity_range
        .as_ref()
        .map_or(0, |r| r.required_bytes);
    if required_bytes == 0 {
        return Ok(None);
    }
    let topologies: Vec<Option<Topology>> = match request.accessibility_requirements {
        Some(req) if !req.requisite.is_empty() => req.requisite.into_iter().map(Some).collect(),
        _ => vec![None],
    };
    let requests = topologies
        .into_iter()
        .map(|accessible_topology| GetCapacityRequest {
            volume_capabilities: request.volume_capabilities.clone(),
            parameters: request.parameters.clone(),
            accessible_topology,
        })
        .collect();
    Ok(Some(CapacityCheck {
        required_bytes,
        requests,
    }))
}

/// What the driver's answers say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CapacityVerdict {
    /// Some topology has room: compete.
    Enough,
    /// No topology has room: do not compete now.
    NotEnough,
    /// A GetCapacity call failed: compete anyway (upstream logs and goes on).
    CheckFailed(String),
}

impl CapacityCheck {
    /// The verdict of the answers so far (`available_capacity` per request, in request order).
    /// The shell stops asking at the first answer that decides.
    pub(crate) fn verdict(&self, answers: &[Result<i64, String>]) -> Option<CapacityVerdict> {
        for answer in answers {
            match answer {
                Ok(available) if *available >= self.required_bytes => {
                    return Some(CapacityVerdict::Enough);
                }
                Ok(_) => {}
                Err(e) => return Some(CapacityVerdict::CheckFailed(e.clone())),
            }
        }
        (answers.len() >= self.requests.len()).then_some(CapacityVerdict::NotEnough)
    }
}
