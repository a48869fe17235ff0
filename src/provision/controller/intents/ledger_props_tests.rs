//! Property tests of the intent log's own entries (issue 41, item 6): a ledger Lease's
//! annotation is text anyone with write access to Leases can change. Decoding must never panic
//! and must name the annotation when it fails; every entry set encodes and decodes back equal;
//! shard names and node ledger names read back.

use proptest::prelude::*;

use super::*;

pub(crate) fn arb_entry() -> impl Strategy<Value = Entry> {
    (
        ("\\PC{0,20}", "\\PC{0,10}", "\\PC{0,10}", "\\PC{0,36}"),
        (
            prop::option::of("\\PC{0,12}"),
            prop::option::of(any::<String>()),
            prop::collection::vec(any::<u8>(), 0..40),
            any::<bool>(),
        ),
    )
        .prop_map(
            |((volume, namespace, claim, uid), (secret, id, request, retain))| Entry {
                volume,
                namespace,
                claim,
                uid,
                secret,
                id,
                request: ByteString(request),
                retain,
            },
        )
}

/// JSON-ish text: brackets, entry keys, base64, and junk.
fn arb_annotation() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(
            prop::sample::select(vec![
                "[",
                "]",
                "{",
                "}",
                ",",
                ":",
                "\"",
                "\"volume\"",
                "\"namespace\"",
                "\"claim\"",
                "\"uid\"",
                "\"request\"",
                "\"AAEC\"",
                "\"!!\"",
                "\"id\"",
                "null",
                "true",
                "1e999",
                "\"\\ud800\"",
                "\"retain\"",
                "\"x\"",
            ]),
            0..24,
        )
        .prop_map(|parts| parts.concat()),
        "\\PC{0,30}",
        any::<String>(),
    ]
}

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_annotation_decodes_or_names_itself_in_the_error(text in arb_annotation()) {
        match decode(&text) {
            Ok(entries) => prop_assert_eq!(decode(&encode(&entries.iter().collect::<Vec<_>>())), Ok(entries)),
            Err(err) => prop_assert!(err.starts_with("malformed csi-provisioner.rs/intents: "), "{err}"),
        }
    }

    #[test]
    fn entries_encode_and_decode_back_equal(entries in prop::collection::vec(arb_entry(), 0..4)) {
        let refs: Vec<&Entry> = entries.iter().collect();
        prop_assert_eq!(decode(&encode(&refs)), Ok(entries));
    }

    #[test]
    fn any_entry_reads_its_secret_and_request_without_panic(entry in arb_entry()) {
        let secret = entry.secret_ref();
        if let Some(s) = &secret {
            prop_assert_eq!(Some(format!("{}/{}", s.namespace, s.name)), entry.secret.clone());
        }
        let _ = entry.request();
        let _ = entry.claim_name();
    }

    #[test]
    fn shard_names_read_back_and_others_do_not_panic(base in "\\PC{0,20}", index in any::<usize>(), other in "\\PC{0,30}") {
        prop_assert_eq!(shard_index(&base, &shard_name(&base, index)), Some(index));
        let _ = shard_index(&base, &other);
    }

    #[test]
    fn node_ledger_names_are_label_values(lease in "\\PC{0,80}", node in "\\PC{0,80}") {
        let name = node_ledger_base(&lease, &node);
        prop_assert!(name.chars().count() <= 63, "{name}");
        prop_assert_eq!(name, node_ledger_base(&lease, &node));
    }
}
