//! `--feature-gates`: the gate names upstream accepts and the parser of the flag's value.

use std::str::FromStr;

use crate::gofmt::parse_go_bool;

/// A feature gate name accepted by `--feature-gates`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FeatureGate {
    /// GA, default on: topology-aware provisioning (when the driver supports it).
    Topology,
    /// Alpha, default off: data sources in other namespaces.
    CrossNamespaceVolumeDataSource,
    /// GA, default on: VolumeAttributesClass parameters in CreateVolume.
    VolumeAttributesClass,
    /// Alpha, default off: release the Lease on SIGTERM.
    ReleaseLeaderElectionOnExit,
    /// Beta, default off: registered by csi-lib-utils but without effect on the provisioner.
    MutableCsiNodeAllocatableCount,
    /// Removed upstream (GA, always on); `=true` is accepted as a no-op for older manifests.
    HonorPvReclaimPolicy,
    /// Sets every alpha gate not set explicitly.
    AllAlpha,
    /// Sets every beta gate not set explicitly.
    AllBeta,
}

impl FeatureGate {
    /// Every gate, in `--help` order.
    pub const ALL: [FeatureGate; 8] = [
        Self::Topology,
        Self::CrossNamespaceVolumeDataSource,
        Self::VolumeAttributesClass,
        Self::ReleaseLeaderElectionOnExit,
        Self::MutableCsiNodeAllocatableCount,
        Self::HonorPvReclaimPolicy,
        Self::AllAlpha,
        Self::AllBeta,
    ];

    /// The gate's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Topology => "Topology",
            Self::CrossNamespaceVolumeDataSource => "CrossNamespaceVolumeDataSource",
            Self::VolumeAttributesClass => "VolumeAttributesClass",
            Self::ReleaseLeaderElectionOnExit => "ReleaseLeaderElectionOnExit",
            Self::MutableCsiNodeAllocatableCount => "MutableCSINodeAllocatableCount",
            Self::HonorPvReclaimPolicy => "HonorPVReclaimPolicy",
            Self::AllAlpha => "AllAlpha",
            Self::AllBeta => "AllBeta",
        }
    }
}

impl FromStr for FeatureGate {
    type Err = ();

    fn from_str(name: &str) -> Result<Self, ()> {
        Self::ALL
            .into_iter()
            .find(|gate| gate.name() == name)
            .ok_or(())
    }
}

/// One `--feature-gates` value: the gates it sets, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FeatureGateList(pub Vec<(FeatureGate, bool)>);

/// Parses `Key=bool,Key2=bool` as component-base's feature gate flag does; an unknown gate is an
/// error (as upstream). `HonorPVReclaimPolicy=true` is accepted as a no-op (the behaviour is always
/// on; older manifests still set it), `=false` is refused because it cannot be honoured.
pub fn parse_feature_gates(text: &str) -> Result<FeatureGateList, String> {
    let mut gates = Vec::new();
    for item in text
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (key, value) = item.split_once('=').ok_or_else(|| {
            format!("missing bool value for {item} (expected {item}=true or {item}=false)")
        })?;
        let (key, value) = (key.trim(), value.trim());
        let gate: FeatureGate = key.parse().map_err(|_| {
            format!(
                "unrecognized feature gate: {key} (known: {})",
                FeatureGate::ALL.map(FeatureGate::name).join(", ")
            )
        })?;
        let enabled =
            parse_go_bool(value).map_err(|err| format!("invalid value of {key}={value}: {err}"))?;
        if gate == FeatureGate::HonorPvReclaimPolicy && !enabled {
            return Err(
                "cannot set feature gate HonorPVReclaimPolicy to false, feature is locked to true \
                 (PV reclaim policy is always honoured; remove the gate)"
                    .to_owned(),
            );
        }
        gates.push((gate, enabled));
    }
    Ok(FeatureGateList(gates))
}
