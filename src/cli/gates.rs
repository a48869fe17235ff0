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
    /// A gate upstream's binary accepts only because it links k8s.io/apiserver and component-base
    /// (see [`INERT_GATES`]): accepted, logged as having no effect here.
    Inert(&'static str),
}

/// Gates upstream v6.3 accepts that mean nothing to a provisioner (k8s.io/apiserver's gates,
/// zpages' and component-base metrics' ones), with the value a gate is locked to, if it is:
/// upstream refuses to start when a locked gate is set to the other value, and so do we.
pub(crate) const INERT_GATES: [(&str, Option<bool>); 45] = [
    ("APIResponseCompression", None),
    ("APIServerIdentity", None),
    ("APIServerTracing", Some(true)),
    ("APIServingWithRoutine", None),
    ("AggregatedDiscoveryRemoveBetaType", Some(true)),
    ("AllowParsingUserUIDFromCertAuth", None),
    ("AllowUnsafeMalformedObjectDeletion", None),
    ("AnonymousAuthConfigurableEndpoints", Some(true)),
    ("AuthorizeWithSelectors", Some(true)),
    ("BtreeWatchCache", Some(true)),
    ("CBORServingAndStorage", None),
    ("ComponentFlagz", None),
    ("ComponentStatusz", None),
    ("ConcurrentWatchObjectDecode", None),
    ("ConsistentListFromCache", Some(true)),
    ("ConstrainedImpersonation", None),
    ("CoordinatedLeaderElection", None),
    ("DeclarativeValidation", Some(true)),
    ("DeclarativeValidationBeta", None),
    ("DeclarativeValidationTakeover", None),
    ("DetectCacheInconsistency", None),
    ("KMSv1", None),
    ("ListFromCacheSnapshot", None),
    ("ManifestBasedAdmissionControlConfig", None),
    ("MutatingAdmissionPolicy", None),
    ("NativeHistograms", None),
    ("OpenAPIEnums", None),
    ("RemoteRequestHeaderUID", None),
    ("ResilientWatchCacheInitialization", Some(true)),
    ("RetryGenerateName", Some(true)),
    ("SeparateCacheWatchRPC", Some(false)),
    ("ShardedListAndWatch", None),
    ("SizeBasedListCostEstimate", None),
    ("StorageVersionAPI", None),
    ("StorageVersionHash", None),
    ("StreamingCollectionEncodingToJSON", Some(true)),
    ("StreamingCollectionEncodingToProtobuf", Some(true)),
    ("StructuredAuthenticationConfiguration", Some(true)),
    ("StructuredAuthenticationConfigurationEgressSelector", None),
    ("StructuredAuthenticationConfigurationJWKSMetrics", None),
    ("TokenRequestServiceAccountUIDValidation", None),
    ("UnauthenticatedHTTP2DOSMitigation", None),
    ("UnknownVersionInteroperabilityProxy", None),
    ("WatchCacheInitializationPostStartHook", None),
    ("WatchList", None),
];

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
            Self::Inert(name) => name,
        }
    }
}

impl FromStr for FeatureGate {
    type Err = ();

    fn from_str(name: &str) -> Result<Self, ()> {
        Self::ALL
            .into_iter()
            .find(|gate| gate.name() == name)
            .or_else(|| {
                INERT_GATES
                    .iter()
                    .find(|(inert, _)| *inert == name)
                    .map(|(inert, _)| Self::Inert(inert))
            })
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
        if let Some(locked) = locked_value(gate)
            && locked != enabled
        {
            return Err(format!(
                "cannot set feature gate {key} to {enabled}, feature is locked to {locked}"
            ));
        }
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

/// The value an inert gate is locked to, if it is.
fn locked_value(gate: FeatureGate) -> Option<bool> {
    let FeatureGate::Inert(name) = gate else {
        return None;
    };
    INERT_GATES
        .iter()
        .find(|(inert, _)| *inert == name)
        .and_then(|(_, locked)| *locked)
}
