//! Shared test fixtures: an in-process driver in a temporary directory with connected clients,
//! request builders, and polling with a deadline.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use mock_csi_driver::csi::v1::{
    CapacityRange, CreateVolumeRequest, Topology, VolumeCapability,
    controller_client::ControllerClient, identity_client::IdentityClient, node_client::NodeClient,
    volume_capability,
};
use mock_csi_driver::{Config, MockDriver, MockDriverHandle};
use tonic::transport::Channel;

/// Upper bound for anything a test waits on; generous because CI machines are slow and shared.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// An in-process driver with clients.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub driver: MockDriverHandle,
    pub controller: ControllerClient<Channel>,
    pub identity: IdentityClient<Channel>,
    pub node: NodeClient<Channel>,
}

impl Fixture {
    /// Starts a driver for node `n1`, configured by `tweak`.
    pub async fn start(tweak: impl FnOnce(Config) -> Config) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = tweak(Config::new(dir.path().join("csi.sock"), "n1"));
        Self::start_in(dir, config).await
    }

    /// Starts a driver with `config` (whose paths should be inside `dir`).
    pub async fn start_in(dir: tempfile::TempDir, config: Config) -> Self {
        let driver = MockDriver::start(config).unwrap();
        let channel = mock_csi_driver::connect(driver.endpoint()).await.unwrap();
        Fixture {
            dir,
            driver,
            controller: ControllerClient::new(channel.clone()),
            identity: IdentityClient::new(channel.clone()),
            node: NodeClient::new(channel),
        }
    }

    /// A path inside the fixture's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Creates a volume and returns its id.
    pub async fn create(&mut self, name: &str, size: i64) -> String {
        self.controller
            .create_volume(create_req(name, size))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id
    }
}

/// A single-node-writer filesystem capability.
pub fn mount_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
    }
}

/// CreateVolume for `name` with `required_bytes = size`.
pub fn create_req(name: &str, size: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap()],
        ..Default::default()
    }
}

/// The node segment under the default key.
pub fn topo(node: &str) -> Topology {
    Topology {
        segments: HashMap::from([(
            mock_csi_driver::config::DEFAULT_TOPOLOGY_KEY.to_owned(),
            node.to_owned(),
        )]),
    }
}

/// Polls `probe` until it returns `Some`, or panics naming `what` after `deadline`.
pub async fn wait_for<T>(
    what: &str,
    deadline: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
