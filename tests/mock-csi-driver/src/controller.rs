//! CSI Controller operations on the driver's store: volumes (create/delete/list/expand/modify/
//! get/validate/publish), capacity, capabilities and snapshots, with the spec's error codes.

use std::collections::BTreeMap;
use std::time::SystemTime;

use tonic::Status;

use crate::config::{ControllerCap, Misbehaviour};
use crate::csi::v1::*;
use crate::driver::Driver;
use crate::rules::{self, Placement, required};
use crate::store::{ContentSource, SnapshotRecord, Store, VolumeRecord};

/// Volume-context key holding the node a volume lives on.
pub const CONTEXT_NODE: &str = "mock.csi/node";

impl Driver {
    fn require_cap(&self, cap: ControllerCap, method: &str) -> Result<(), Status> {
        if self.faults.has_capability(cap) {
            Ok(())
        } else {
            Err(Status::unimplemented(format!(
                "{method} is not available: capability {cap} is switched off"
            )))
        }
    }

    /// CreateVolume.
    pub fn create_volume(&self, req: CreateVolumeRequest) -> Result<CreateVolumeResponse, Status> {
        self.require_cap(ControllerCap::CreateDeleteVolume, "CreateVolume")?;
        required("name", &req.name)?;
        rules::volume_capabilities(&req.volume_capabilities)?;
        rules::secrets("CreateVolume", &self.config.required_secrets, &req.secrets)?;
        if !req.mutable_parameters.is_empty() {
            if self
                .faults
                .misbehaves(Misbehaviour::RefuseMutableParametersOnCreate)
            {
                return Err(Status::invalid_argument(
                    "mutable_parameters are not accepted by CreateVolume (refuse-mutable-parameters-on-create switch)",
                ));
            }
            if !self.faults.has_capability(ControllerCap::ModifyVolume) {
                return Err(Status::invalid_argument(
                    "mutable_parameters given but MODIFY_VOLUME is not supported",
                ));
            }
            if !self
                .faults
                .misbehaves(Misbehaviour::AcceptUnknownMutableParameters)
            {
                rules::mutable_parameters(
                    &self.config.mutable_parameter_keys,
                    &req.mutable_parameters,
                )?;
            }
        }
        let candidates = if self.config.topology {
            rules::candidate_segments(req.accessibility_requirements.as_ref())
        } else {
            None
        };
        let parameters = rules::sorted(&req.parameters);
        let mut store = self.store();

        let wanted_source = self.requested_source(req.volume_content_source.as_ref())?;
        if let Some(existing) = store.volume_by_name(&req.name)
            && !self.faults.misbehaves(Misbehaviour::NonIdempotentCreate)
        {
            let conflict = if !rules::fits(existing.capacity_bytes, req.capacity_range.as_ref()) {
                Some(format!(
                    "it has {} bytes, outside the requested capacity_range",
                    existing.capacity_bytes
                ))
            } else if existing.parameters != parameters {
                Some("it was created with different parameters".to_owned())
            } else if existing.content_source != wanted_source {
                Some("it was created from a different content source".to_owned())
            } else if candidates
                .as_ref()
                .is_some_and(|c| !c.contains(&existing.segment))
            {
                Some(format!(
                    "it lives on node {}, outside the accessibility requirements",
                    existing.node
                ))
            } else {
                None
            };
            if let Some(why) = conflict {
                return Err(Status::already_exists(format!(
                    "volume {:?} already exists as {} but is incompatible: {why}; use another name or the same arguments",
                    req.name, existing.id
                )));
            }
            tracing::info!(name = %req.name, volume_id = %existing.id, "CreateVolume: already exists, returning it");
            return Ok(self.create_response(existing));
        }

        let source = match wanted_source {
            Some(s) => Some(self.resolve_source(&store, s)?),
            None => None,
        };
        let size = rules::volume_size(
            req.capacity_range.as_ref(),
            self.config.default_volume_size,
            self.config.max_volume_size,
            source.as_ref().map(|s| s.1),
        )?;
        let nodes = self.config.nodes();
        let node = Placement {
            nodes: &nodes,
            candidates: candidates.as_deref(),
            pinned: source.as_ref().map(|s| s.2.as_str()),
            size,
        }
        .choose(
            |n| self.config.segment_of(n),
            |n| self.config.capacity_total - store.used_on(n),
        )?;

        let seq = store.next_seq();
        let uuid = uuid::Uuid::new_v4().simple().to_string();
        let segment = self.config.segment_of(&node);
        let zone = segment.values().next().cloned().unwrap_or_default();
        let fill = |t: &str| crate::config::fill_template(t, &uuid, &req.name, &node, &zone);
        let mut volume_context = BTreeMap::from([(CONTEXT_NODE.to_owned(), node.clone())]);
        for (k, v) in &self.config.volume_context {
            volume_context.insert(k.clone(), fill(v));
        }
        let record = VolumeRecord {
            id: if self.faults.misbehaves(Misbehaviour::ControlCharVolumeId) {
                format!("vol-{uuid}\n\u{1b}[31mFAKE LOG LINE")
            } else {
                fill(&self.config.volume_id_template)
            },
            name: req.name.clone(),
            capacity_bytes: size,
            segment,
            volume_context,
            node,
            parameters,
            mutable_parameters: rules::sorted(&req.mutable_parameters),
            content_source: source.map(|s| s.0),
            secret_keys: rules::secret_keys(&req.secrets),
            seq,
        };
        store.put_volume(record.clone());
        if let Err(e) = self.persist(&mut store) {
            store.remove_volume(&record.id);
            return Err(e);
        }
        tracing::info!(
            name = %record.name,
            volume_id = %record.id,
            node = %record.node,
            capacity_bytes = record.capacity_bytes,
            "CreateVolume: volume created"
        );
        drop(store);
        self.maybe_crash_after_create(&record);
        Ok(self.create_response(&record))
    }

    fn create_response(&self, v: &VolumeRecord) -> CreateVolumeResponse {
        let mut volume = self.volume_proto(v);
        if self.faults.misbehaves(Misbehaviour::UndersizedVolumes) {
            volume.capacity_bytes /= 2;
        }
        if self.faults.misbehaves(Misbehaviour::DropContentSource) {
            volume.content_source = None;
        }
        if self.faults.misbehaves(Misbehaviour::EmptyVolumeId) {
            volume.volume_id.clear();
        }
        if self.faults.misbehaves(Misbehaviour::HugeVolumeContext) {
            volume
                .volume_context
                .insert("blob".to_owned(), "x".repeat(10 << 20));
        }
        CreateVolumeResponse {
            volume: Some(volume),
        }
    }

    /// The content source a request asks for; INVALID_ARGUMENT when it is malformed or its kind
    /// is switched off.
    fn requested_source(
        &self,
        source: Option<&VolumeContentSource>,
    ) -> Result<Option<ContentSource>, Status> {
        use volume_content_source::Type;
        let Some(source) = source else {
            return Ok(None);
        };
        match &source.r#type {
            None => Err(Status::invalid_argument(
                "volume_content_source has neither snapshot nor volume set",
            )),
            Some(Type::Snapshot(s)) => {
                if !self
                    .faults
                    .has_capability(ControllerCap::CreateDeleteSnapshot)
                {
                    return Err(Status::invalid_argument(
                        "creating a volume from a snapshot is not supported: CREATE_DELETE_SNAPSHOT is switched off",
                    ));
                }
                required("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?;
                Ok(Some(ContentSource::Snapshot(s.snapshot_id.clone())))
            }
            Some(Type::Volume(v)) => {
                if !self.faults.has_capability(ControllerCap::CloneVolume) {
                    return Err(Status::invalid_argument(
                        "cloning a volume is not supported: CLONE_VOLUME is switched off",
                    ));
                }
                required("volume_content_source.volume.volume_id", &v.volume_id)?;
                Ok(Some(ContentSource::Volume(v.volume_id.clone())))
            }
        }
    }

    /// Looks a content source up: (source, its size, the node its data lives on); NOT_FOUND when
    /// it does not exist.
    fn resolve_source(
        &self,
        store: &Store,
        source: ContentSource,
    ) -> Result<(ContentSource, i64, String), Status> {
        match &source {
            ContentSource::Snapshot(id) => {
                let snap = store.snapshot(id).ok_or_else(|| {
                    Status::not_found(format!("source snapshot {id} does not exist"))
                })?;
                let found = (snap.size_bytes, snap.node.clone());
                Ok((source, found.0, found.1))
            }
            ContentSource::Volume(id) => {
                let vol = store.volume(id).ok_or_else(|| {
                    Status::not_found(format!("source volume {id} does not exist"))
                })?;
                let found = (vol.capacity_bytes, vol.node.clone());
                Ok((source, found.0, found.1))
            }
        }
    }

    /// DeleteVolume.
    pub fn delete_volume(&self, req: DeleteVolumeRequest) -> Result<DeleteVolumeResponse, Status> {
        self.require_cap(ControllerCap::CreateDeleteVolume, "DeleteVolume")?;
        required("volume_id", &req.volume_id)?;
        rules::secrets("DeleteVolume", &self.config.required_secrets, &req.secrets)?;
        let mut store = self.store();
        let Some(removed) = store.remove_volume(&req.volume_id) else {
            if self.faults.misbehaves(Misbehaviour::DeleteUnknownNotFound) {
                return Err(Status::not_found(format!(
                    "volume {} does not exist",
                    req.volume_id
                )));
            }
            tracing::info!(volume_id = %req.volume_id, "DeleteVolume: no such volume, nothing to do");
            return Ok(DeleteVolumeResponse {});
        };
        if let Err(e) = self.persist(&mut store) {
            store.put_volume(removed);
            return Err(e);
        }
        tracing::info!(volume_id = %removed.id, name = %removed.name, node = %removed.node, "DeleteVolume: volume deleted");
        Ok(DeleteVolumeResponse {})
    }

    /// ListVolumes, paged by creation order.
    pub fn list_volumes(&self, req: ListVolumesRequest) -> Result<ListVolumesResponse, Status> {
        self.require_cap(ControllerCap::ListVolumes, "ListVolumes")?;
        let max = page_size(req.max_entries)?;
        let store = self.store();
        let start = self.start_token(&store, &req.starting_token)?;
        let page = store.page_volumes(start, max);
        Ok(ListVolumesResponse {
            entries: page
                .entries
                .iter()
                .map(|v| list_volumes_response::Entry {
                    volume: Some(self.volume_proto(v)),
                    status: None,
                })
                .collect(),
            next_token: page.next_token.unwrap_or_default(),
        })
    }

    fn start_token(&self, store: &Store, token: &str) -> Result<u64, Status> {
        match store.parse_token(token) {
            Some(start) => Ok(start),
            None if self.faults.misbehaves(Misbehaviour::AcceptBadListToken) => Ok(0),
            None => Err(Status::aborted(format!(
                "starting_token {token:?} was not issued by this driver; restart the listing without a token"
            ))),
        }
    }

    /// GetCapacity: free bytes of the node whose segment is asked for, or of all nodes.
    pub fn get_capacity(&self, req: GetCapacityRequest) -> Result<GetCapacityResponse, Status> {
        self.require_cap(ControllerCap::GetCapacity, "GetCapacity")?;
        let store = self.store();
        let free = |node: &str| (self.config.capacity_total - store.used_on(node)).max(0);
        let available = match &req.accessible_topology {
            Some(t) if !self.config.topology => {
                return Err(Status::invalid_argument(format!(
                    "accessible_topology {:?} given, but this driver does not advertise VOLUME_ACCESSIBILITY_CONSTRAINTS",
                    t.segments
                )));
            }
            // A node's segment is {topology key: node}, so the pool is found by name: building
            // every pool per call made one mock standing for thousands of nodes (the capacity
            // benchmark) spend its CPU here.
            Some(t) => match (t.segments.len(), t.segments.get(&self.config.topology_key)) {
                (1, Some(node)) if self.config.has_node(node) => free(node),
                _ => 0,
            },
            None => self.config.nodes().iter().map(|n| free(n)).sum(),
        };
        Ok(GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: self.config.max_volume_size,
            minimum_volume_size: None,
        })
    }

    /// ControllerGetCapabilities: the capabilities currently switched on.
    pub fn controller_capabilities(&self) -> ControllerGetCapabilitiesResponse {
        use controller_service_capability::{Rpc, Type, rpc::Type as T};
        let capabilities = self
            .faults
            .capabilities()
            .into_iter()
            .map(|c| {
                let t = match c {
                    ControllerCap::CreateDeleteVolume => T::CreateDeleteVolume,
                    ControllerCap::PublishUnpublishVolume => T::PublishUnpublishVolume,
                    ControllerCap::ListVolumes => T::ListVolumes,
                    ControllerCap::GetCapacity => T::GetCapacity,
                    ControllerCap::CreateDeleteSnapshot => T::CreateDeleteSnapshot,
                    ControllerCap::ListSnapshots => T::ListSnapshots,
                    ControllerCap::CloneVolume => T::CloneVolume,
                    ControllerCap::ExpandVolume => T::ExpandVolume,
                    ControllerCap::GetVolume => T::GetVolume,
                    ControllerCap::ModifyVolume => T::ModifyVolume,
                    ControllerCap::GetSnapshot => T::GetSnapshot,
                };
                ControllerServiceCapability {
                    r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
                }
            })
            .collect();
        ControllerGetCapabilitiesResponse { capabilities }
    }

    /// ControllerPublishVolume: checks the volume and node exist; nothing is attached.
    pub fn controller_publish(
        &self,
        req: ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, Status> {
        self.require_cap(
            ControllerCap::PublishUnpublishVolume,
            "ControllerPublishVolume",
        )?;
        required("volume_id", &req.volume_id)?;
        required("node_id", &req.node_id)?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        rules::volume_capability(0, cap)?;
        if self.store().volume(&req.volume_id).is_none() {
            return Err(Status::not_found(format!(
                "volume {} does not exist",
                req.volume_id
            )));
        }
        if !self.config.nodes().contains(&req.node_id) {
            return Err(Status::not_found(format!(
                "node {} is not served by this driver",
                req.node_id
            )));
        }
        Ok(ControllerPublishVolumeResponse::default())
    }

    /// ControllerUnpublishVolume: always succeeds for a valid request.
    pub fn controller_unpublish(
        &self,
        req: ControllerUnpublishVolumeRequest,
    ) -> Result<ControllerUnpublishVolumeResponse, Status> {
        self.require_cap(
            ControllerCap::PublishUnpublishVolume,
            "ControllerUnpublishVolume",
        )?;
        required("volume_id", &req.volume_id)?;
        Ok(ControllerUnpublishVolumeResponse {})
    }

    /// ValidateVolumeCapabilities: every well-formed capability is supported.
    pub fn validate_capabilities(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, Status> {
        required("volume_id", &req.volume_id)?;
        rules::volume_capabilities(&req.volume_capabilities)?;
        if self.store().volume(&req.volume_id).is_none() {
            return Err(Status::not_found(format!(
                "volume {} does not exist",
                req.volume_id
            )));
        }
        Ok(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: req.mutable_parameters,
            }),
            message: String::new(),
        })
    }

    /// ControllerExpandVolume: grows a volume within its node's pool; never shrinks.
    pub fn expand_volume(
        &self,
        req: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse, Status> {
        self.require_cap(ControllerCap::ExpandVolume, "ControllerExpandVolume")?;
        required("volume_id", &req.volume_id)?;
        let range = req
            .capacity_range
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        let wanted = if range.required_bytes > 0 {
            range.required_bytes
        } else {
            range.limit_bytes
        };
        if wanted <= 0 {
            return Err(Status::invalid_argument(
                "capacity_range needs a positive required_bytes or limit_bytes",
            ));
        }
        let mut store = self.store();
        let v = store
            .volume(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", req.volume_id)))?
            .clone();
        if wanted <= v.capacity_bytes {
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: v.capacity_bytes,
                node_expansion_required: false,
            });
        }
        if self.config.max_volume_size.is_some_and(|max| wanted > max) {
            return Err(Status::out_of_range(format!(
                "{wanted} bytes is above the largest volume this driver creates ({:?} bytes)",
                self.config.max_volume_size
            )));
        }
        let free = self.config.capacity_total - store.used_on(&v.node);
        if wanted - v.capacity_bytes > free {
            return Err(Status::out_of_range(format!(
                "growing to {wanted} bytes needs {} more bytes, node {} has {free} free",
                wanted - v.capacity_bytes,
                v.node
            )));
        }
        store.update_volume(&v.id, |r| r.capacity_bytes = wanted);
        if let Err(e) = self.persist(&mut store) {
            store.update_volume(&v.id, |r| r.capacity_bytes = v.capacity_bytes);
            return Err(e);
        }
        tracing::info!(volume_id = %v.id, capacity_bytes = wanted, "ControllerExpandVolume: volume grown");
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: wanted,
            node_expansion_required: false,
        })
    }

    /// ControllerGetVolume.
    pub fn get_volume(
        &self,
        req: ControllerGetVolumeRequest,
    ) -> Result<ControllerGetVolumeResponse, Status> {
        self.require_cap(ControllerCap::GetVolume, "ControllerGetVolume")?;
        required("volume_id", &req.volume_id)?;
        let store = self.store();
        let v = store
            .volume(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", req.volume_id)))?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(self.volume_proto(v)),
            status: Some(controller_get_volume_response::VolumeStatus::default()),
        })
    }

    /// ControllerModifyVolume: sets the given mutable parameters; keys not given are kept (the CSI
    /// spec forbids acting on absent keys), so an empty map changes nothing and is OK. The volume
    /// is looked up before its parameters are judged: NOT_FOUND says more than INVALID_ARGUMENT
    /// about a request for a volume that is gone.
    pub fn modify_volume(
        &self,
        req: ControllerModifyVolumeRequest,
    ) -> Result<ControllerModifyVolumeResponse, Status> {
        self.require_cap(ControllerCap::ModifyVolume, "ControllerModifyVolume")?;
        required("volume_id", &req.volume_id)?;
        let mut store = self.store();
        let Some(volume) = store.volume(&req.volume_id) else {
            if self.faults.misbehaves(Misbehaviour::ModifyUnknownVolumeOk) {
                return Ok(ControllerModifyVolumeResponse {});
            }
            return Err(Status::not_found(format!(
                "volume {} does not exist",
                req.volume_id
            )));
        };
        let before = volume.mutable_parameters.clone();
        if !self
            .faults
            .misbehaves(Misbehaviour::AcceptUnknownMutableParameters)
        {
            rules::mutable_parameters(
                &self.config.mutable_parameter_keys,
                &req.mutable_parameters,
            )?;
        }
        let after = {
            let mut p = before.clone();
            p.extend(rules::sorted(&req.mutable_parameters));
            p
        };
        if after == before {
            tracing::info!(volume_id = %req.volume_id, "ControllerModifyVolume: parameters already set, nothing to do");
            return Ok(ControllerModifyVolumeResponse {});
        }
        store.update_volume(&req.volume_id, |v| v.mutable_parameters = after);
        if let Err(e) = self.persist(&mut store) {
            store.update_volume(&req.volume_id, |v| v.mutable_parameters = before);
            return Err(e);
        }
        tracing::info!(volume_id = %req.volume_id, keys = ?rules::secret_keys(&req.mutable_parameters), "ControllerModifyVolume: parameters set");
        Ok(ControllerModifyVolumeResponse {})
    }

    /// CreateSnapshot: cut at once, always ready to use.
    pub fn create_snapshot(
        &self,
        req: CreateSnapshotRequest,
    ) -> Result<CreateSnapshotResponse, Status> {
        self.require_cap(ControllerCap::CreateDeleteSnapshot, "CreateSnapshot")?;
        required("name", &req.name)?;
        required("source_volume_id", &req.source_volume_id)?;
        let mut store = self.store();
        if let Some(existing) = store.snapshot_by_name(&req.name) {
            if existing.source_volume_id != req.source_volume_id {
                return Err(Status::already_exists(format!(
                    "snapshot {:?} already exists as {} of volume {}, not of {}",
                    req.name, existing.id, existing.source_volume_id, req.source_volume_id
                )));
            }
            return Ok(CreateSnapshotResponse {
                snapshot: Some(snapshot_proto(existing)),
            });
        }
        let source = store.volume(&req.source_volume_id).ok_or_else(|| {
            Status::not_found(format!(
                "source volume {} does not exist",
                req.source_volume_id
            ))
        })?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let record = SnapshotRecord {
            id: format!("snap-{}", uuid::Uuid::new_v4().simple()),
            name: req.name.clone(),
            source_volume_id: source.id.clone(),
            size_bytes: source.capacity_bytes,
            node: source.node.clone(),
            parameters: rules::sorted(&req.parameters),
            creation_time_secs: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
            creation_time_nanos: i32::try_from(now.subsec_nanos()).unwrap_or(0),
            seq: store.next_seq(),
        };
        store.put_snapshot(record.clone());
        if let Err(e) = self.persist(&mut store) {
            store.remove_snapshot(&record.id);
            return Err(e);
        }
        tracing::info!(name = %record.name, snapshot_id = %record.id, source_volume_id = %record.source_volume_id, "CreateSnapshot: snapshot cut");
        Ok(CreateSnapshotResponse {
            snapshot: Some(snapshot_proto(&record)),
        })
    }

    /// DeleteSnapshot: unknown ids are OK.
    pub fn delete_snapshot(
        &self,
        req: DeleteSnapshotRequest,
    ) -> Result<DeleteSnapshotResponse, Status> {
        self.require_cap(ControllerCap::CreateDeleteSnapshot, "DeleteSnapshot")?;
        required("snapshot_id", &req.snapshot_id)?;
        let mut store = self.store();
        if let Some(removed) = store.remove_snapshot(&req.snapshot_id) {
            if let Err(e) = self.persist(&mut store) {
                store.put_snapshot(removed);
                return Err(e);
            }
            tracing::info!(snapshot_id = %req.snapshot_id, "DeleteSnapshot: snapshot deleted");
        }
        Ok(DeleteSnapshotResponse {})
    }

    /// ListSnapshots, optionally filtered by snapshot id or source volume.
    pub fn list_snapshots(
        &self,
        req: ListSnapshotsRequest,
    ) -> Result<ListSnapshotsResponse, Status> {
        self.require_cap(ControllerCap::ListSnapshots, "ListSnapshots")?;
        let max = page_size(req.max_entries)?;
        let store = self.store();
        let start = self.start_token(&store, &req.starting_token)?;
        let page = store.page_snapshots(start, max, |s| {
            (req.snapshot_id.is_empty() || s.id == req.snapshot_id)
                && (req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id)
        });
        Ok(ListSnapshotsResponse {
            entries: page
                .entries
                .iter()
                .map(|s| list_snapshots_response::Entry {
                    snapshot: Some(snapshot_proto(s)),
                })
                .collect(),
            next_token: page.next_token.unwrap_or_default(),
        })
    }

    /// GetSnapshot.
    pub fn get_snapshot(&self, req: GetSnapshotRequest) -> Result<GetSnapshotResponse, Status> {
        self.require_cap(ControllerCap::GetSnapshot, "GetSnapshot")?;
        required("snapshot_id", &req.snapshot_id)?;
        let store = self.store();
        let s = store.snapshot(&req.snapshot_id).ok_or_else(|| {
            Status::not_found(format!("snapshot {} does not exist", req.snapshot_id))
        })?;
        Ok(GetSnapshotResponse {
            snapshot: Some(snapshot_proto(s)),
        })
    }
}

fn page_size(max_entries: i32) -> Result<usize, Status> {
    usize::try_from(max_entries).map_err(|_| {
        Status::invalid_argument(format!(
            "max_entries must not be negative, got {max_entries}"
        ))
    })
}

/// The proto form of a snapshot.
pub fn snapshot_proto(s: &SnapshotRecord) -> Snapshot {
    Snapshot {
        size_bytes: s.size_bytes,
        snapshot_id: s.id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: s.creation_time_secs,
            nanos: s.creation_time_nanos,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}
