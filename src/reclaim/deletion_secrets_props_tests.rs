//! Property tests of the deletion-secret annotations read back from PVs (issue 41, item 6): a PV's
//! annotations can be edited by anyone who can write PVs. Reading them must never panic; a pair
//! our provisioner wrote reads back as the secret it named, and a half-empty pair as no secret.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;

use super::*;

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_deletion_secret_annotations_read_back_as_written(
        name in prop::option::of(prop_oneof![Just(String::new()), "\\PC{0,20}"]),
        namespace in prop::option::of(prop_oneof![Just(String::new()), "\\PC{0,20}"]),
        class in prop::option::of("[a-z]{0,6}"),
        claim in prop::option::of(("\\PC{0,8}", "\\PC{0,8}")),
        params in prop::collection::btree_map(
            prop::sample::select(vec![
                names::PARAM_PROVISIONER_SECRET_NAME, names::PARAM_PROVISIONER_SECRET_NAMESPACE,
                names::PARAM_SECRET_NAME, names::PARAM_SECRET_NAMESPACE,
            ]).prop_map(str::to_owned),
            prop_oneof!["\\$\\{(pv\\.name|pvc\\.name|pvc\\.namespace|pvc\\.annotations\\['a'\\]|x)\\}", "[a-z-]{0,6}", "\\PC{0,6}"],
            0..4,
        ),
        lookup in 0u8..3,
    ) {
        let annotations: BTreeMap<String, String> = [
            name.clone().map(|v| (names::ANN_DELETION_SECRET_NAME.to_owned(), v)),
            namespace.clone().map(|v| (names::ANN_DELETION_SECRET_NAMESPACE.to_owned(), v)),
        ]
        .into_iter()
        .flatten()
        .collect();
        let pv = PersistentVolume {
            metadata: ObjectMeta { name: Some("pvc-1".to_owned()), annotations: Some(annotations), ..ObjectMeta::default() },
            spec: Some(PersistentVolumeSpec {
                storage_class_name: class,
                claim_ref: claim.map(|(name, namespace)| ObjectReference {
                    name: Some(name),
                    namespace: Some(namespace),
                    ..ObjectReference::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            status: None,
        };
        let sc = StorageClass { parameters: Some(params), ..StorageClass::default() };
        let lookup = match lookup {
            0 => StorageClassLookup::Found(Arc::new(sc.clone())),
            1 => StorageClassLookup::Missing,
            _ => StorageClassLookup::Untranslatable("no".to_owned()),
        };
        let got = deletion_secrets(&pv, &lookup);
        if let (Some(name), Some(namespace)) = (name, namespace) {
            let want = if name.is_empty() || namespace.is_empty() {
                DeletionSecrets::None
            } else {
                DeletionSecrets::Fetch(SecretRef::new(name, namespace))
            };
            prop_assert_eq!(got, Ok(want));
        }
    }
}
