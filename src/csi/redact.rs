//! Secret-stripping formatting of CSI messages: the only way a CSI request or response reaches a log.
//!
//! Every field the spec marks `csi_secret` is a `map<string, string> secrets`; its content is replaced
//! by `***stripped***` (upstream's protosanitizer marker) before the message is formatted. A unit test
//! reads `proto/csi.proto` and fails if the spec marks a field this module does not strip.

use std::collections::HashMap;
use std::fmt;

use super::v1;

/// The text that stands in for secret content, as upstream prints it.
pub const STRIPPED: &str = "***stripped***";

/// A CSI message that can be formatted without its secrets.
pub trait Redact: fmt::Debug + Clone {
    /// Replaces the content of every `csi_secret` field by [`STRIPPED`]. No-op for messages without one.
    fn strip_secrets(&mut self) {}
}

/// Formats `message` with its secrets stripped: `debug!("GRPC request: {}", redacted(&req))`.
pub fn redacted<T: Redact>(message: &T) -> Redacted<'_, T> {
    Redacted(message)
}

/// Display adapter returned by [`redacted`]. It clones only when actually formatted, i.e. when the
/// log level is enabled.
pub struct Redacted<'a, T>(pub &'a T);

/// Longest message written to a log line; a driver answering megabytes must not flood the log.
const LOG_LIMIT: usize = 16 * 1024;

impl<T: Redact> fmt::Display for Redacted<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut copy = self.0.clone();
        copy.strip_secrets();
        let text = format!("{copy:?}");
        if text.len() <= LOG_LIMIT {
            return f.write_str(&text);
        }
        let mut end = LOG_LIMIT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{}... ({} bytes in all)", &text[..end], text.len())
    }
}

fn strip_map(secrets: &mut HashMap<String, String>) {
    // Keys go too: upstream hides the whole field, and key names can hint at the backend's auth scheme.
    if !secrets.is_empty() {
        secrets.clear();
        secrets.insert(STRIPPED.to_owned(), STRIPPED.to_owned());
    }
}

macro_rules! without_secrets {
    ($($message:ident),* $(,)?) => {
        $(impl Redact for v1::$message {})*
    };
}

macro_rules! with_secrets_map {
    ($($message:ident),* $(,)?) => {
        $(impl Redact for v1::$message {
            fn strip_secrets(&mut self) {
                strip_map(&mut self.secrets);
            }
        })*

        /// Every `csi_secret` field this module strips, as `package.Message.field`.
        pub const SECRET_FIELDS: &[&str] = &[$(concat!("csi.v1.", stringify!($message), ".secrets")),*];
    };
}

with_secrets_map!(
    CreateVolumeRequest,
    DeleteVolumeRequest,
    ControllerPublishVolumeRequest,
    ControllerUnpublishVolumeRequest,
    ValidateVolumeCapabilitiesRequest,
    ControllerModifyVolumeRequest,
    CreateSnapshotRequest,
    DeleteSnapshotRequest,
    ListSnapshotsRequest,
    GetSnapshotRequest,
    ControllerExpandVolumeRequest,
    NodeStageVolumeRequest,
    NodePublishVolumeRequest,
    NodeExpandVolumeRequest,
    CreateVolumeGroupSnapshotRequest,
    DeleteVolumeGroupSnapshotRequest,
    GetVolumeGroupSnapshotRequest,
    GetMetadataAllocatedRequest,
    GetMetadataDeltaRequest,
);

// The messages without secrets that the sidecar sends or receives ([`super::client`]); a call
// added there does not compile until its messages are listed.
without_secrets!(
    GetPluginInfoRequest,
    GetPluginInfoResponse,
    GetPluginCapabilitiesRequest,
    GetPluginCapabilitiesResponse,
    ProbeRequest,
    ProbeResponse,
    CreateVolumeResponse,
    DeleteVolumeResponse,
    ListVolumesRequest,
    ListVolumesResponse,
    GetCapacityRequest,
    GetCapacityResponse,
    ControllerGetCapabilitiesRequest,
    ControllerGetCapabilitiesResponse,
    NodeGetInfoRequest,
    NodeGetInfoResponse,
);

#[cfg(test)]
#[path = "redact_tests.rs"]
mod tests;
