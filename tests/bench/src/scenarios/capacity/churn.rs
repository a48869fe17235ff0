//! Capacity churn: at a steady rate, a random node's free capacity changes, by a 1Gi volume
//! created on it or deleted from it directly on the mock driver's CSI socket (no claim, no PV: the
//! sidecar learns of it only by polling GetCapacity, as of any change made outside Kubernetes).
//! The node sequence is fixed, so every binary sees the same changes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use mock_csi_driver::csi::v1::controller_client::ControllerClient;
use mock_csi_driver::csi::v1::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode,
};
use mock_csi_driver::csi::v1::{
    CapacityRange, CreateVolumeRequest, DeleteVolumeRequest, Topology, TopologyRequirement,
    VolumeCapability,
};
use tonic::transport::Channel;

use crate::cluster::TOPOLOGY_KEY;

/// Counts shared with the sampler.
#[derive(Debug, Default)]
pub struct Counts {
    pub changes: AtomicU64,
    pub failures: AtomicU64,
}

/// The running churn; stopped when dropped.
pub struct Churn {
    pub counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The same for every run, so every binary sees the same changes.
const SEED: u64 = 42;

/// splitmix64: a fixed, well-spread sequence without a dependency.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The node index of the next change.
fn pick(state: &mut u64, nodes: usize) -> usize {
    (next(state) % nodes.max(1) as u64) as usize
}

struct Changer {
    csi: ControllerClient<Channel>,
    nodes: Vec<String>,
    rng: u64,
    /// Volume ids the churn holds, per node index.
    held: HashMap<usize, Vec<String>>,
    seq: u64,
}

impl Changer {
    /// One change: the node's volume deleted if it holds one, else one created there.
    async fn step(&mut self) -> Result<()> {
        let i = pick(&mut self.rng, self.nodes.len());
        if let Some(id) = self.held.get_mut(&i).and_then(Vec::pop) {
            self.csi
                .delete_volume(DeleteVolumeRequest {
                    volume_id: id,
                    ..Default::default()
                })
                .await?;
            return Ok(());
        }
        self.seq += 1;
        let at = Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), self.nodes[i].clone())]),
        };
        let volume = self
            .csi
            .create_volume(CreateVolumeRequest {
                name: format!("churn-{}", self.seq),
                capacity_range: Some(CapacityRange {
                    required_bytes: 1 << 30,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![VolumeCapability {
                    access_mode: Some(AccessMode {
                        mode: access_mode::Mode::SingleNodeWriter as i32,
                    }),
                    access_type: Some(AccessType::Mount(MountVolume::default())),
                }],
                accessibility_requirements: Some(TopologyRequirement {
                    requisite: vec![at.clone()],
                    preferred: vec![at],
                }),
                ..Default::default()
            })
            .await?
            .into_inner()
            .volume
            .ok_or_else(|| anyhow::anyhow!("CreateVolume answered no volume"))?;
        self.held.entry(i).or_default().push(volume.volume_id);
        Ok(())
    }
}

impl Churn {
    /// `per_min` changes a minute over `nodes`, the first one period from now; `None` for 0.
    pub async fn start(socket: &Path, nodes: Vec<String>, per_min: u32) -> Result<Option<Self>> {
        if per_min == 0 || nodes.is_empty() {
            return Ok(None);
        }
        let channel = mock_csi_driver::connect(socket).await?;
        let mut changer = Changer {
            csi: ControllerClient::new(channel),
            nodes,
            rng: SEED,
            held: HashMap::new(),
            seq: 0,
        };
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let period = Duration::from_secs_f64(60.0 / f64::from(per_min));
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            // A slow call delays the next change rather than bunching the missed ones.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match changer.step().await {
                    Ok(()) => c.changes.fetch_add(1, Ordering::Relaxed),
                    Err(_) => c.failures.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
        Ok(Some(Self { counts, task }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequence(nodes: usize, n: usize) -> Vec<usize> {
        let mut state = SEED;
        (0..n).map(|_| pick(&mut state, nodes)).collect()
    }

    #[test]
    fn the_sequence_is_fixed_and_covers_the_nodes() {
        let a = sequence(10, 1000);
        assert_eq!(a, sequence(10, 1000));
        assert!(a.iter().all(|i| *i < 10));
        let mut seen = [false; 10];
        a.iter().for_each(|i| seen[*i] = true);
        assert!(seen.iter().all(|s| *s));
    }
}
