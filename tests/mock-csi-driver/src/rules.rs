//! Pure CSI rules the controller applies: required fields, volume capabilities, capacity ranges,
//! topology placement and secret checks, each returning the spec's gRPC code when violated.

use std::collections::{BTreeMap, HashMap};

use tonic::Status;

use crate::csi::v1::{CapacityRange, TopologyRequirement, VolumeCapability, volume_capability};

/// A topology segment: `{key: value}`.
pub type Segment = BTreeMap<String, String>;

/// The CSI size limit of string fields such as names and ids.
const MAX_STRING_BYTES: usize = 128;

/// INVALID_ARGUMENT unless `value` (the field `field`) is present and within the size limit.
pub fn required(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    if value.len() > MAX_STRING_BYTES {
        return Err(Status::invalid_argument(format!(
            "{field} is {} bytes long; CSI allows at most {MAX_STRING_BYTES}",
            value.len()
        )));
    }
    Ok(())
}

/// INVALID_ARGUMENT unless there is at least one capability and each has an access mode and an
/// access type.
pub fn volume_capabilities(caps: &[VolumeCapability]) -> Result<(), Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument(
            "volume_capabilities is required: give at least one volume capability",
        ));
    }
    caps.iter()
        .enumerate()
        .try_for_each(|(i, c)| volume_capability(i, c))
}

/// INVALID_ARGUMENT unless `cap` has an access mode and an access type.
pub fn volume_capability(index: usize, cap: &VolumeCapability) -> Result<(), Status> {
    let mode = cap.access_mode.map(|m| m.mode).unwrap_or_default();
    if mode == volume_capability::access_mode::Mode::Unknown as i32
        || volume_capability::access_mode::Mode::try_from(mode).is_err()
    {
        return Err(Status::invalid_argument(format!(
            "volume capability {index} has no valid access_mode.mode"
        )));
    }
    if cap.access_type.is_none() {
        return Err(Status::invalid_argument(format!(
            "volume capability {index} has no access_type: set block or mount"
        )));
    }
    Ok(())
}

/// Picks the size of a new volume.
///
/// - `required_bytes` wins when set; otherwise the source's size, otherwise `default` (capped
///   at `limit_bytes`).
/// - Negative values or `required > limit`: INVALID_ARGUMENT.
/// - Smaller than the source, or above `max`: OUT_OF_RANGE.
pub fn volume_size(
    range: Option<&CapacityRange>,
    default: i64,
    max: Option<i64>,
    source_size: Option<i64>,
) -> Result<i64, Status> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(Status::invalid_argument(
            "capacity_range values must not be negative",
        ));
    }
    if limit > 0 && required > limit {
        return Err(Status::invalid_argument(format!(
            "capacity_range.required_bytes ({required}) is larger than limit_bytes ({limit})"
        )));
    }
    let source = source_size.unwrap_or(0);
    let size = match (required, source) {
        (r, _) if r > 0 => r,
        (_, s) if s > 0 => s,
        _ if limit > 0 => default.min(limit),
        _ => default,
    };
    if limit > 0 && size > limit {
        return Err(Status::out_of_range(format!(
            "the source is {source} bytes, more than capacity_range.limit_bytes ({limit})"
        )));
    }
    if size < source {
        return Err(Status::out_of_range(format!(
            "requested {size} bytes, smaller than the {source}-byte source; ask for at least {source}"
        )));
    }
    if let Some(max) = max
        && size > max
    {
        return Err(Status::out_of_range(format!(
            "requested {size} bytes; the largest volume this driver creates is {max} bytes"
        )));
    }
    Ok(size)
}

/// Whether an existing volume of `capacity` bytes satisfies `range`.
pub fn fits(capacity: i64, range: Option<&CapacityRange>) -> bool {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    capacity >= required && (limit == 0 || capacity <= limit)
}

/// The segments a volume may be placed in, preferred first and then requisite, without
/// repeats. `None` means "anywhere" (no requirement given).
pub fn candidate_segments(req: Option<&TopologyRequirement>) -> Option<Vec<Segment>> {
    let req = req?;
    if req.preferred.is_empty() && req.requisite.is_empty() {
        return None;
    }
    let mut out: Vec<Segment> = Vec::new();
    for t in req.preferred.iter().chain(&req.requisite) {
        let seg: Segment = t
            .segments
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !out.contains(&seg) {
            out.push(seg);
        }
    }
    Some(out)
}

/// Where a new volume goes.
#[derive(Debug)]
pub struct Placement<'a> {
    /// Nodes this driver can place volumes on, in its own order of preference.
    pub nodes: &'a [String],
    /// Allowed segments (preferred first), or `None` for anywhere.
    pub candidates: Option<&'a [Segment]>,
    /// The volume must live on this node (the data source is there).
    pub pinned: Option<&'a str>,
    /// Bytes needed.
    pub size: i64,
}

impl Placement<'_> {
    /// Picks the first allowed node with enough free space.
    ///
    /// RESOURCE_EXHAUSTED when no node of this driver is in the allowed topology (the spec's
    /// "unable to provision in accessible_topology") or none of them has room.
    pub fn choose(
        &self,
        segment_of: impl Fn(&str) -> Segment,
        free: impl Fn(&str) -> i64,
    ) -> Result<String, Status> {
        let allowed: Vec<&String> = match self.candidates {
            None => self.nodes.iter().collect(),
            Some(segments) => segments
                .iter()
                .flat_map(|seg| {
                    self.nodes
                        .iter()
                        .filter(|n| segment_of(n) == *seg)
                        .collect::<Vec<_>>()
                })
                .collect(),
        };
        let allowed: Vec<&String> = allowed
            .into_iter()
            .filter(|n| self.pinned.is_none_or(|p| p == n.as_str()))
            .collect();
        if allowed.is_empty() {
            let pinned = self
                .pinned
                .map(|p| format!(" (the data source lives on node {p})"))
                .unwrap_or_default();
            return Err(Status::resource_exhausted(format!(
                "cannot provision in the requested topology: this driver serves nodes {:?}{pinned} and none of them is in the accessibility requirements",
                self.nodes
            )));
        }
        if let Some(node) = allowed.iter().find(|n| free(n) >= self.size) {
            return Ok((*node).clone());
        }
        let report: Vec<String> = allowed
            .iter()
            .map(|n| format!("{n}: {} bytes free", free(n)))
            .collect();
        Err(Status::resource_exhausted(format!(
            "not enough space for {} bytes ({}); delete volumes or raise --capacity-total",
            self.size,
            report.join(", ")
        )))
    }
}

/// UNAUTHENTICATED unless every required secret is present with the right value. Messages name
/// the key, never a value.
pub fn secrets(
    method: &str,
    required: &BTreeMap<String, String>,
    given: &HashMap<String, String>,
) -> Result<(), Status> {
    for (key, want) in required {
        match given.get(key) {
            None => {
                return Err(Status::unauthenticated(format!(
                    "{method}: secret {key:?} is missing; pass the provisioner secret configured with --require-secret"
                )));
            }
            Some(v) if v != want => {
                return Err(Status::unauthenticated(format!(
                    "{method}: secret {key:?} has the wrong value"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Sorted names of the secrets a call carried.
pub fn secret_keys(given: &HashMap<String, String>) -> Vec<String> {
    let mut keys: Vec<String> = given.keys().cloned().collect();
    keys.sort();
    keys
}

/// INVALID_ARGUMENT when a mutable parameter key is not in `allowed` (empty `allowed` = any key).
pub fn mutable_parameters(
    allowed: &std::collections::BTreeSet<String>,
    given: &HashMap<String, String>,
) -> Result<(), Status> {
    if allowed.is_empty() {
        return Ok(());
    }
    let mut unknown: Vec<&String> = given.keys().filter(|k| !allowed.contains(*k)).collect();
    unknown.sort();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "mutable parameters {unknown:?} are not supported; supported keys: {allowed:?}"
        )))
    }
}

/// A sorted copy of a proto map.
pub fn sorted(map: &HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::v1::Topology;
    use tonic::Code;

    fn range(required: i64, limit: i64) -> Option<CapacityRange> {
        Some(CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        })
    }

    fn seg(node: &str) -> Segment {
        BTreeMap::from([("topology.mock.csi/node".to_owned(), node.to_owned())])
    }

    fn topo(node: &str) -> Topology {
        Topology {
            segments: seg(node).into_iter().collect(),
        }
    }

    #[test]
    fn sizes_follow_the_capacity_range_the_source_and_the_default() {
        assert_eq!(volume_size(None, 100, None, None).unwrap(), 100);
        assert_eq!(
            volume_size(range(10, 0).as_ref(), 100, None, None).unwrap(),
            10
        );
        assert_eq!(
            volume_size(range(0, 50).as_ref(), 100, None, None).unwrap(),
            50
        );
        assert_eq!(
            volume_size(range(0, 0).as_ref(), 100, None, Some(70)).unwrap(),
            70
        );
        assert_eq!(
            volume_size(range(80, 80).as_ref(), 100, Some(80), None).unwrap(),
            80
        );
    }

    #[test]
    fn impossible_sizes_get_the_spec_codes() {
        let code = |r: Option<CapacityRange>, max, src| {
            volume_size(r.as_ref(), 100, max, src).unwrap_err().code()
        };
        assert_eq!(code(range(-1, 0), None, None), Code::InvalidArgument);
        assert_eq!(code(range(20, 10), None, None), Code::InvalidArgument);
        assert_eq!(code(range(200, 0), Some(100), None), Code::OutOfRange);
        assert_eq!(code(range(10, 0), None, Some(50)), Code::OutOfRange);
        assert_eq!(code(range(0, 10), None, Some(50)), Code::OutOfRange);
    }

    #[test]
    fn an_existing_volume_fits_a_range_it_satisfies() {
        assert!(fits(100, None));
        assert!(fits(100, range(100, 100).as_ref()));
        assert!(!fits(100, range(101, 0).as_ref()));
        assert!(!fits(100, range(0, 99).as_ref()));
    }

    #[test]
    fn preferred_segments_come_first_without_repeats() {
        let req = TopologyRequirement {
            requisite: vec![topo("a"), topo("b")],
            preferred: vec![topo("b")],
        };
        assert_eq!(
            candidate_segments(Some(&req)).unwrap(),
            vec![seg("b"), seg("a")]
        );
        assert!(candidate_segments(Some(&TopologyRequirement::default())).is_none());
        assert!(candidate_segments(None).is_none());
    }

    #[test]
    fn placement_takes_the_first_allowed_node_with_room() {
        let nodes = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let candidates = vec![seg("c"), seg("b")];
        let free = |n: &str| if n == "c" { 5 } else { 100 };
        let p = Placement {
            nodes: &nodes,
            candidates: Some(&candidates),
            pinned: None,
            size: 10,
        };
        assert_eq!(p.choose(seg, free).unwrap(), "b");
        let p = Placement {
            nodes: &nodes,
            candidates: None,
            pinned: None,
            size: 10,
        };
        assert_eq!(p.choose(seg, free).unwrap(), "a");
    }

    #[test]
    fn placement_outside_this_drivers_nodes_or_without_room_is_resource_exhausted() {
        let nodes = vec!["a".to_owned()];
        let elsewhere = vec![seg("x")];
        let p = Placement {
            nodes: &nodes,
            candidates: Some(&elsewhere),
            pinned: None,
            size: 1,
        };
        let err = p.choose(seg, |_| 100).unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        let p = Placement {
            nodes: &nodes,
            candidates: None,
            pinned: None,
            size: 101,
        };
        let err = p.choose(seg, |_| 100).unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(
            err.message().contains("a: 100 bytes free"),
            "{}",
            err.message()
        );
        let p = Placement {
            nodes: &nodes,
            candidates: None,
            pinned: Some("z"),
            size: 1,
        };
        assert_eq!(
            p.choose(seg, |_| 100).unwrap_err().code(),
            Code::ResourceExhausted
        );
    }

    #[test]
    fn secrets_must_all_match_and_errors_never_show_values() {
        let required = BTreeMap::from([("user".to_owned(), "s3cr3t".to_owned())]);
        let ok = HashMap::from([("user".to_owned(), "s3cr3t".to_owned())]);
        let wrong = HashMap::from([("user".to_owned(), "guess".to_owned())]);
        assert!(secrets("CreateVolume", &required, &ok).is_ok());
        let err = secrets("CreateVolume", &required, &HashMap::new()).unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        let err = secrets("CreateVolume", &required, &wrong).unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        assert!(!err.message().contains("s3cr3t") && !err.message().contains("guess"));
    }

    #[test]
    fn capabilities_need_a_mode_and_an_access_type() {
        use volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
        let good = VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        };
        assert!(volume_capabilities(std::slice::from_ref(&good)).is_ok());
        assert_eq!(
            volume_capabilities(&[]).unwrap_err().code(),
            Code::InvalidArgument
        );
        let no_type = VolumeCapability {
            access_type: None,
            ..good.clone()
        };
        assert_eq!(
            volume_capabilities(&[no_type]).unwrap_err().code(),
            Code::InvalidArgument
        );
        let no_mode = VolumeCapability {
            access_mode: None,
            ..good
        };
        assert_eq!(
            volume_capabilities(&[no_mode]).unwrap_err().code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn required_fields_and_long_names_are_invalid_arguments() {
        assert_eq!(
            required("name", "").unwrap_err().code(),
            Code::InvalidArgument
        );
        assert_eq!(
            required("name", &"x".repeat(129)).unwrap_err().code(),
            Code::InvalidArgument
        );
        assert!(required("name", "pvc-1").is_ok());
    }
}
