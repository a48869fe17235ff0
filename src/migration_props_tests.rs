//! Property tests of the seven in-tree translations (issue 41, item 6): handles, attributes,
//! zone labels and node affinities come from PVs anyone may have written. Translating either way
//! must never panic, errors must be upstream's texts, and a valid handle must come back as it went
//! (CSI -> in-tree -> CSI).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolumeSpec, SecretReference, VolumeNodeAffinity,
};
use proptest::prelude::*;
use regex::Regex;

use super::*;
use crate::migration::topology::{
    BETA_REGION, BETA_ZONE, GA_REGION, GA_ZONE, aws_region, gce_region,
};

/// Every plugin's zone key, and the in-tree ones.
const TOPOLOGY_KEYS: [&str; 9] = [
    GA_ZONE,
    BETA_ZONE,
    GA_REGION,
    BETA_REGION,
    aws_ebs::ZONE_KEY,
    gce_pd::ZONE_KEY,
    azure_disk::ZONE_KEY,
    cinder::ZONE_KEY,
    vsphere::ZONE_KEY,
];

/// Node-affinity terms, each a list of `key In values` requirements.
type Terms = Option<Vec<Vec<(&'static str, Vec<String>)>>>;

/// Zone-ish values: real shapes of each cloud, the `__` delimiter, and junk.
fn arb_zone() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(vec![
            "us-east1-b", "us-east1-c", "europe-west4-a", "us-west-2a", "us-west-2b",
            "us-west-2-lax-1a", "us-east-1-wl1-bos-wlz-1", "us-gov-west-1a", "1", "nova", "",
            "a__b", "us-east1-b__us-east1-c", "__", "us-west-é", "é-é-é",
        ]).prop_map(str::to_owned),
        1 => "[a-z0-9_-]{0,16}",
        1 => "\\PC{0,10}",
    ]
}

fn arb_terms() -> impl Strategy<Value = Terms> {
    prop::option::weighted(
        0.7,
        prop::collection::vec(
            prop::collection::vec(
                (
                    prop::sample::select(TOPOLOGY_KEYS.to_vec()),
                    prop::collection::vec(arb_zone(), 0..3),
                ),
                0..3,
            ),
            0..3,
        ),
    )
}

fn arb_labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        prop::sample::select(vec![GA_ZONE, BETA_ZONE, GA_REGION, BETA_REGION, "other"])
            .prop_map(str::to_owned),
        arb_zone(),
        0..3,
    )
}

/// Attribute keys any of the seven reads, with arbitrary values.
fn arb_attributes() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    prop::option::of(prop::collection::btree_map(
        prop::sample::select(vec![
            "partition",
            "cachingmode",
            "fstype",
            "sharename",
            "secretname",
            "secretnamespace",
            vsphere::VOLUME_PATH_ATTRIBUTE,
            "storagepolicyname",
            "kind",
            "other",
        ])
        .prop_map(str::to_owned),
        prop_oneof!["-?[0-9]{0,12}", "\\PC{0,10}", Just(String::new())],
        0..4,
    ))
}

/// Handle-ish text: every plugin's separators and shapes, and junk.
fn arb_handle() -> impl Strategy<Value = String> {
    prop_oneof![
        "vol-[a-z0-9]{0,8}",
        "aws://[a-z0-9-]{0,8}/{0,2}vol-[a-z0-9/]{0,8}",
        "projects/[a-z]{0,4}/(zones|regions)/[a-z0-9-]{0,10}/disks/[a-z0-9/]{0,6}",
        "(https?://[a-z.]{0,6}/vhds/[a-z.]{0,6}|/subscriptions/[a-z]{0,4}/resourceGroups/[a-z]{0,4}/providers/Microsoft.Compute/disks/[a-z]{0,6})",
        "[a-z#é]{0,5}#[a-z]{0,5}#[a-z#]{0,5}",
        "\\PC{0,16}",
        any::<String>(),
    ]
}

fn pv(
    name: &str,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    terms: Terms,
) -> PersistentVolume {
    let mut pv = PersistentVolume::default();
    pv.metadata.name = Some(name.to_owned());
    pv.metadata.labels = (!labels.is_empty()).then_some(labels);
    pv.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    pv.spec = Some(PersistentVolumeSpec {
        node_affinity: terms.map(|terms| VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: terms
                    .into_iter()
                    .map(|exprs| NodeSelectorTerm {
                        match_expressions: Some(
                            exprs
                                .into_iter()
                                .map(|(key, values)| NodeSelectorRequirement {
                                    key: key.to_owned(),
                                    operator: "In".to_owned(),
                                    values: Some(values),
                                })
                                .collect(),
                        ),
                        match_fields: None,
                    })
                    .collect(),
            }),
        }),
        ..PersistentVolumeSpec::default()
    });
    pv
}

fn handle_of(pv: &PersistentVolume) -> Option<&str> {
    Some(pv.spec.as_ref()?.csi.as_ref()?.volume_handle.as_str())
}

/// The first line of each translation error, as upstream words it.
static UPSTREAM_ERRORS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^(failed to translate topology\. PV:.*\. Error:Failed to handle region topology\. error: ",
        r"(no zones specified|zone in unexpected format, expected: \{locale\}-\{region\}-\{zone\}, got: .*",
        r"|Unexpected zone format: .* is not a valid AWS zone|multiple or no regions gotten from zones, got: map\[.*\])",
        r"|failed to get id components\.Got: \d+, wanted 6 components or more\. ",
        r"|(F|f)ailed to convert partition .* to integer: strconv\.Atoi: parsing .*: invalid syntax",
        r"|could not get disk name from .*, correct format: .*",
        r#"|error parsing volume id: ".*", should at least contain two #"#,
        r"|failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume \(.*\)",
        r"|failed to get region from zones: .*",
        r"|kind\(.*\) is not supported in csi migration",
        r"|could not find a secret namespace in PersistentVolumeSource or ClaimRef",
        r")$",
    ))
    .expect("pattern")
});

/// Ours where upstream deletes an Azure File share under a made-up id (issue 41).
static OUR_ERRORS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^(cannot tell the storage account of Azure File share .*: secretName .* is not azure-storage-account-<storage account>-secret; the share is kept: .*",
        r"|annotation csi-provisioner\.rs/volume-id .* does not name the PV's Azure File share .*; the share is kept: .*",
        r")$",
    ))
    .expect("pattern")
});

/// Upstream's words, or for Azure File our own where upstream leaks the share.
fn expected_error(plugin: Plugin, err: &str) -> bool {
    UPSTREAM_ERRORS.is_match(err)
        || (plugin == Plugin::AzureFile
            && OUR_ERRORS.is_match(err.lines().next().unwrap_or_default()))
}

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_csi_pv_of_the_seven_translates_both_ways_or_fails_in_upstreams_words(
        plugin in prop::sample::select(PLUGINS.to_vec()),
        handle in arb_handle(),
        attributes in arb_attributes(),
        fs_type in prop::option::of("[a-z0-9]{0,4}"),
        secret in prop::option::of(("[a-z-]{0,8}", prop::option::of("[a-z]{0,4}"))),
        labels in arb_labels(),
        terms in arb_terms(),
    ) {
        let mut csi_pv = pv("pv-1", labels, BTreeMap::new(), terms);
        csi_pv.spec.get_or_insert_default().csi = Some(CSIPersistentVolumeSource {
            driver: plugin.csi_name().to_owned(),
            volume_handle: handle,
            volume_attributes: attributes,
            fs_type,
            node_stage_secret_ref: secret.map(|(name, namespace)| SecretReference { name: Some(name), namespace }),
            ..CSIPersistentVolumeSource::default()
        });
        let in_tree = match plugin.csi_to_in_tree(&csi_pv) {
            Ok(pv) => pv,
            Err(err) => {
                prop_assert!(UPSTREAM_ERRORS.is_match(err.lines().next().unwrap_or_default()), "{plugin:?}: {err}");
                return Ok(());
            }
        };
        prop_assert_eq!(Plugin::of_in_tree_pv(&in_tree), Some(plugin));
        match plugin.in_tree_to_csi(&in_tree) {
            Ok(back) => prop_assert_eq!(back.spec.as_ref().and_then(|s| s.csi.as_ref()).map(|c| c.driver.as_str()), Some(plugin.csi_name())),
            Err(err) => prop_assert!(expected_error(plugin, &err), "{plugin:?} back: {err}"),
        }
    }

    #[test]
    fn a_valid_handle_comes_back_as_it_went(
        plugin in prop::sample::select(PLUGINS.to_vec()),
        id in "[a-z0-9]{1,12}",
        rg in "[a-z0-9]{1,8}",
        account in "[a-z0-9-]{1,8}",
        zone in prop::option::of(prop::sample::select(vec!["us-east1-b", "europe-west4-a", "us-west-2a", "us-east-1-wl1-bos-wlz-1"])),
        beta in any::<bool>(),
    ) {
        let zone_key = match plugin {
            Plugin::AwsEbs => aws_ebs::ZONE_KEY,
            Plugin::GcePd => gce_pd::ZONE_KEY,
            Plugin::AzureDisk => azure_disk::ZONE_KEY,
            Plugin::Cinder => cinder::ZONE_KEY,
            Plugin::Vsphere => vsphere::ZONE_KEY,
            Plugin::AzureFile | Plugin::Portworx => "unused",
        };
        // Only zones the plugin's region rule accepts.
        let zone = zone.filter(|z| match plugin {
            Plugin::GcePd => gce_region(&[(*z).to_owned()]).is_ok(),
            Plugin::AwsEbs => aws_region(&[(*z).to_owned()]).is_ok(),
            _ => true,
        });
        let handle = match plugin {
            Plugin::AwsEbs => format!("vol-{id}"),
            Plugin::GcePd => format!("projects/UNSPECIFIED/zones/{}/disks/{id}", zone.unwrap_or("UNSPECIFIED")),
            Plugin::AzureDisk => format!("/subscriptions/s/resourceGroups/{rg}/providers/Microsoft.Compute/disks/{id}"),
            // The in-tree source keeps neither the PV name nor a namespace: they come from the PV.
            Plugin::AzureFile => format!("{rg}#{account}#{id}#pv-1#default"),
            Plugin::Cinder | Plugin::Portworx | Plugin::Vsphere => id.clone(),
        };
        let terms = zone.filter(|_| !matches!(plugin, Plugin::AzureFile | Plugin::Portworx))
            .map(|z| vec![vec![(zone_key, vec![z.to_owned()])]]);
        let labels = if beta && plugin == Plugin::Vsphere { BTreeMap::from([(BETA_ZONE.to_owned(), "z".to_owned())]) } else { BTreeMap::new() };
        let mut csi_pv = pv("pv-1", labels, BTreeMap::new(), terms);
        csi_pv.spec.get_or_insert_default().csi = Some(CSIPersistentVolumeSource {
            driver: plugin.csi_name().to_owned(),
            volume_handle: handle.clone(),
            // vSphere keeps its in-tree path in an attribute, not in the handle.
            volume_attributes: Some(BTreeMap::from([(vsphere::VOLUME_PATH_ATTRIBUTE.to_owned(), handle.clone())])),
            ..CSIPersistentVolumeSource::default()
        });
        let in_tree = plugin.csi_to_in_tree(&csi_pv);
        prop_assert!(in_tree.is_ok(), "{plugin:?} {handle}: {in_tree:?}");
        let back = plugin.in_tree_to_csi(&in_tree.expect("checked"));
        prop_assert!(back.is_ok(), "{plugin:?} {handle}: {back:?}");
        let back = back.expect("checked");
        prop_assert_eq!(handle_of(&back), Some(handle.as_str()), "{:?}", plugin);
    }

    #[test]
    fn any_in_tree_labels_and_affinity_translate_to_csi_without_panic(
        plugin in prop::sample::select(PLUGINS.to_vec()),
        id in "\\PC{0,12}",
        labels in arb_labels(),
        annotations in prop::collection::btree_map(
            prop::sample::select(vec![azure_file::RESOURCE_GROUP_ANNOTATION, crate::names::ANN_PV_VOLUME_ID, portworx::AUTH_SECRET_NAME, portworx::AUTH_SECRET_NAMESPACE]).prop_map(str::to_owned),
            prop_oneof!["\\PC{0,8}", "[a-z]{0,3}#[a-z]{0,3}#\\PC{0,6}(#[a-z]{0,3})?"],
            0..3,
        ),
        terms in arb_terms(),
        secret_name in "\\PC{0,40}",
        kind in prop::option::of(prop::sample::select(vec!["Managed", "managed", "Shared", "Dedicated", ""])),
        partition in prop::option::of(any::<i32>()),
    ) {
        use k8s_openapi::api::core::v1::{
            AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
            CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource, PortworxVolumeSource,
            VsphereVirtualDiskVolumeSource,
        };
        let mut in_tree = pv("pv-1", labels, annotations, terms);
        let spec = in_tree.spec.get_or_insert_default();
        match plugin {
            Plugin::AwsEbs => spec.aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource { volume_id: id, partition, ..Default::default() }),
            Plugin::GcePd => spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource { pd_name: id, partition, ..Default::default() }),
            Plugin::AzureDisk => spec.azure_disk = Some(AzureDiskVolumeSource { disk_uri: id, kind: kind.map(str::to_owned), ..Default::default() }),
            Plugin::AzureFile => spec.azure_file = Some(AzureFilePersistentVolumeSource { share_name: id, secret_name, secret_namespace: kind.map(str::to_owned), ..Default::default() }),
            Plugin::Cinder => spec.cinder = Some(CinderPersistentVolumeSource { volume_id: id, ..Default::default() }),
            Plugin::Vsphere => spec.vsphere_volume = Some(VsphereVirtualDiskVolumeSource { volume_path: id, ..Default::default() }),
            Plugin::Portworx => spec.portworx_volume = Some(PortworxVolumeSource { volume_id: id, ..Default::default() }),
        }
        match plugin.in_tree_to_csi(&in_tree) {
            Ok(csi_pv) => {
                // And back: whatever the handle, no panic.
                let _ = plugin.csi_to_in_tree(&csi_pv);
            }
            Err(err) => prop_assert!(expected_error(plugin, &err), "{plugin:?}: {err}"),
        }
    }

    /// Issue 41: whatever the driver's id (its own shape, upstream's, a subscription, an empty
    /// resource group) and however its context and node-stage secret name the share, the PV
    /// written back in in-tree form is deleted with exactly that id.
    #[test]
    fn an_azure_file_share_comes_back_with_the_drivers_own_id(
        rg in "[a-z0-9]{0,8}",
        account in "[a-z0-9]{1,8}",
        share in "[a-z0-9-]{1,12}",
        tail in prop::collection::vec("[a-z0-9.-]{0,8}", 0..5),
        share_in_context in any::<bool>(),
        secret in prop::option::of(("\\PC{1,20}", "[a-z]{0,6}")),
    ) {
        let mut id = format!("{rg}#{account}#{share}");
        for segment in &tail {
            id.push('#');
            id.push_str(segment);
        }
        let mut csi_pv = pv("pv-1", BTreeMap::new(), BTreeMap::new(), None);
        csi_pv.spec.get_or_insert_default().csi = Some(CSIPersistentVolumeSource {
            driver: Plugin::AzureFile.csi_name().to_owned(),
            volume_handle: id.clone(),
            volume_attributes: share_in_context.then(|| BTreeMap::from([("shareName".to_owned(), share.clone())])),
            node_stage_secret_ref: secret.map(|(name, namespace)| SecretReference { name: Some(name), namespace: Some(namespace) }),
            ..CSIPersistentVolumeSource::default()
        });
        let in_tree = Plugin::AzureFile.csi_to_in_tree(&csi_pv);
        prop_assert!(in_tree.is_ok(), "{id}: {in_tree:?}");
        let in_tree = in_tree.expect("checked");
        // A secret namespace of "" stands for none: upstream's error, whatever the id.
        let back = Plugin::AzureFile.in_tree_to_csi(&in_tree);
        match back {
            Ok(back) => prop_assert_eq!(handle_of(&back), Some(id.as_str())),
            Err(err) => prop_assert_eq!(err, "could not find a secret namespace in PersistentVolumeSource or ClaimRef"),
        }
    }

    #[test]
    fn region_rules_take_any_zones_without_panic(zones in prop::collection::vec(arb_zone(), 0..4)) {
        for result in [gce_region(&zones), aws_region(&zones)] {
            if let Err(err) = result {
                let wrapped = format!("failed to translate topology. PV:x. Error:Failed to handle region topology. error: {err}");
                prop_assert!(UPSTREAM_ERRORS.is_match(&wrapped), "{err}");
            }
        }
    }

    #[test]
    fn ebs_ids_parse_or_get_upstreams_error(id in prop_oneof!["aws://[a-z0-9-]{0,8}/{0,3}(vol-)?[a-z0-9/]{0,8}", "\\PC{0,16}"]) {
        match aws_ebs::ebs_volume_id(&id) {
            // A bare id is taken as it is; a URL's path must be `vol-` and no further segment.
            Ok(vol) if !id.starts_with("aws://") => prop_assert_eq!(vol, id),
            Ok(vol) => prop_assert!(vol.starts_with("vol-") && !vol.contains('/') && id.contains(&vol), "{id} -> {vol}"),
            Err(err) => prop_assert_eq!(err, format!("Invalid format for AWS volume ({id})")),
        }
    }

    #[test]
    fn disk_uris_and_account_secrets_read_as_upstreams_patterns(s in prop_oneof![
        "(http|HTTP|htt|é)[a-zé:/.]{0,10}(/vhds/)?[a-z\n]{0,4}",
        "[a-z/]{0,4}/subscriptions/[a-z/]{0,4}/resourceGroups/[a-z]{0,4}/providers/Microsoft.Compute/disks/[a-z/]{0,4}",
        "[a-z\n-]{0,6}(azure-storage-account-)?[a-z\n-]{0,6}(-secret)?[a-z-]{0,4}(azure-storage-account-[a-z\n]{0,3}-secret)?",
        "\\PC{0,12}",
    ]) {
        // Go's `isManagedDisk`: by the first four bytes.
        let managed = !(s.len() > 4 && s.as_bytes()[..4].eq_ignore_ascii_case(b"http"));
        prop_assert_eq!(azure_disk::is_managed_disk(&s), managed);
        let pattern = if managed { azure_disk::MANAGED_DISK_PATTERN } else { azure_disk::UNMANAGED_DISK_PATTERN };
        let want = Regex::new(pattern).expect("pattern").captures(&s).map(|c| c[1].to_owned())
            .ok_or_else(|| format!("could not get disk name from {s}, correct format: {pattern}"));
        prop_assert_eq!(azure_disk::disk_name(&s), want);
        // Upstream's `azure-storage-account-(.+)-secret`.
        let account = Regex::new("azure-storage-account-(.+)-secret").expect("pattern").captures(&s).map(|c| c[1].to_owned());
        prop_assert_eq!(azure_file::storage_account_name(&s), account, "{:?}", s);
    }
}
