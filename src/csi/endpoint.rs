//! Parsing of `--csi-address` into the Unix socket path the sidecar dials.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where the CSI driver listens: always a Unix domain socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    path: PathBuf,
}

/// Why a `--csi-address` value was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EndpointError {
    /// Nothing to dial.
    #[error(
        "CSI address is empty: set --csi-address to the driver's Unix socket, e.g. /run/csi/socket"
    )]
    Empty,
    /// `unix://host/path`: gRPC's unix scheme has no host part.
    #[error(
        "CSI address {0:?} has a host part; use unix:///absolute/path (three slashes) or a plain /absolute/path"
    )]
    HasAuthority(String),
    /// Anything that is not a Unix socket (tcp, dns, http, ...).
    #[error(
        "CSI address {0:?} is not a Unix socket; only /path, unix:///path and unix:path are supported"
    )]
    UnsupportedScheme(String),
}

impl Endpoint {
    /// Accepts the forms upstream accepts for a Unix socket:
    /// - `/path` (upstream prepends `unix://` to a leading `/`),
    /// - `unix:///path` and `unix:/path` (absolute),
    /// - `unix:path` (relative to the working directory, as gRPC's unix scheme allows).
    pub fn parse(address: &str) -> Result<Self, EndpointError> {
        let address = address.trim();
        if address.is_empty() {
            return Err(EndpointError::Empty);
        }
        if address.starts_with('/') {
            return Ok(Self::from_path(address));
        }
        let Some(rest) = address.strip_prefix("unix:") else {
            return Err(EndpointError::UnsupportedScheme(address.to_owned()));
        };
        let path = match rest.strip_prefix("//") {
            // unix:///abs → "/abs"; unix://host/abs → rejected.
            Some(after) if after.starts_with('/') || after.is_empty() => after,
            Some(_) => return Err(EndpointError::HasAuthority(address.to_owned())),
            None => rest,
        };
        if path.is_empty() {
            return Err(EndpointError::Empty);
        }
        Ok(Self::from_path(path))
    }

    /// An endpoint for a socket path (no parsing; used by tests and callers that already have a path).
    pub fn from_path(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The socket path to connect to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())
    }
}

#[cfg(test)]
#[path = "endpoint_props_tests.rs"]
mod props_tests;

#[cfg(test)]
#[path = "endpoint_tests.rs"]
mod tests;
