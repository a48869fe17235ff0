//! Property tests of the claim record (issue 41, item 6): its annotations sit on a claim whose
//! author can edit them. Reading a record back must never panic, whatever the annotations say
//! (a junk request, a junk size for the minimal request), and a record written from an entry
//! reads back as that entry.

use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
use k8s_openapi::api::core::v1::VolumeResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use proptest::prelude::*;

use super::*;

fn claim(
    annotations: BTreeMap<String, String>,
    size: Option<String>,
    modes: Vec<String>,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            namespace: Some("ns".to_owned()),
            name: Some("c".to_owned()),
            uid: Some("uid-1".to_owned()),
            finalizers: Some(vec![names::FINALIZER_PROVISIONING_INTENT.to_owned()]),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(modes),
            resources: size.map(|s| VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), Quantity(s))])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_record_annotations_read_back_without_panic(
        annotations in prop::collection::btree_map(
            prop::sample::select(INTENT_ANNOTATIONS.to_vec()).prop_map(str::to_owned),
            prop_oneof!["\\PC{0,16}", "[A-Za-z0-9+/=]{0,24}", Just(String::new()), Just("true".to_owned())],
            0..6,
        ),
        size in prop::option::of(prop_oneof!["[0-9.eEKMGi+-]{0,8}", "\\PC{0,8}"]),
        modes in prop::collection::vec(prop::sample::select(vec!["ReadWriteOnce", "ReadWriteMany", "Bogus", ""]).prop_map(str::to_owned), 0..3),
    ) {
        let pvc = claim(annotations.clone(), size, modes);
        let Some(entry) = entry_of(&pvc) else {
            // Only a record without a volume name is no record.
            prop_assert!(annotations.get(names::ANN_INTENT_VOLUME_NAME).is_none_or(String::is_empty));
            return Ok(());
        };
        prop_assert_eq!(Some(&entry.volume), annotations.get(names::ANN_INTENT_VOLUME_NAME));
        // A record without its request is of a build that kept no policy: it reads as Retain.
        if annotations.get(names::ANN_INTENT_REQUEST).is_none_or(String::is_empty) {
            prop_assert!(entry.retain);
        }
    }

    #[test]
    fn a_record_written_from_an_entry_reads_back_as_that_entry(
        volume in "[a-z0-9-]{1,20}",
        secret in prop::option::of(("[a-z0-9-]{1,10}", "\\PC{1,10}")),
        id in prop::option::of("\\PC{1,20}"),
        request in prop::collection::vec(any::<u8>(), 1..40),
        retain in any::<bool>(),
    ) {
        let entry = Entry {
            volume,
            namespace: "ns".to_owned(),
            claim: "c".to_owned(),
            uid: "uid-1".to_owned(),
            secret: secret.map(|(namespace, name)| format!("{namespace}/{name}")),
            id,
            request: ByteString(request),
            retain,
        };
        let annotations = intent_annotations(&entry)
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_owned(), v?)))
            .collect();
        prop_assert_eq!(entry_of(&claim(annotations, None, Vec::new())), Some(entry));
    }
}
