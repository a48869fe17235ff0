//! Property tests of the deletion decision (fault suite, issue 16): for any PV shape and any
//! claim, attachment and locality answer, `decide` does not panic and never deletes a volume it
//! must keep (bound or claim unknown, not Delete policy, not ours, attached, not this node's).

use proptest::prelude::*;

use super::*;
use crate::names::FINALIZER_PV_DELETION_PROTECTION as OURS;
use crate::testing::{DRIVER, pv, sc};

fn arb_pv() -> impl Strategy<Value = PersistentVolume> {
    (
        (
            prop::sample::select(vec![DRIVER, "other.csi", ""]),
            prop::option::of(prop::sample::select(vec![DRIVER, "other.csi", "", "x"])),
            prop::option::of(prop::sample::select(vec![
                "Delete", "Retain", "Recycle", "Bogus",
            ])),
            prop::option::of(prop::sample::select(vec![
                "Pending",
                "Available",
                "Bound",
                "Released",
                "Failed",
                "",
            ])),
        ),
        (
            any::<bool>(),
            any::<bool>(),
            prop::option::of((
                "[a-z]{0,3}",
                "[a-z-]{0,6}",
                prop::option::of("[a-z0-9-]{0,6}"),
            )),
            any::<bool>(),
            prop::option::of(prop::sample::select(vec!["", "fast", "gone"])),
            prop::option::of(("[a-z${}.]{0,12}", "[a-z${}.]{0,12}")),
        ),
    )
        .prop_map(
            |((driver, by, policy, phase), (finalizer, deleting, claim, no_csi, class, secret))| {
                let mut b = pv("pv-1").driver(driver);
                if let Some(by) = by {
                    b = b.provisioned_by(by);
                }
                if let Some(p) = policy {
                    b = b.reclaim(p);
                }
                if let Some(p) = phase {
                    b = b.phase(p);
                }
                if finalizer {
                    b = b.finalizer(OURS);
                }
                if deleting {
                    b = b.deleting();
                }
                if let Some((ns, name, uid)) = claim {
                    b = b.claim_ref(&ns, &name, uid.as_deref().unwrap_or_default());
                }
                if let Some(c) = class {
                    b = b.class(c);
                }
                if let Some((name, ns)) = secret {
                    b = b.deletion_secret(&name, &ns);
                }
                if no_csi {
                    b = b.no_csi();
                }
                b.build()
            },
        )
}

fn arb_claim() -> impl Strategy<Value = ClaimState> {
    prop::sample::select(vec![
        ClaimState::Exists,
        ClaimState::Gone,
        ClaimState::Unknown,
    ])
}

fn arb_attachment() -> impl Strategy<Value = AttachmentState> {
    prop_oneof![
        Just(AttachmentState::Detached),
        Just(AttachmentState::Unknown),
        "[a-z]{1,5}".prop_map(AttachmentState::AttachedTo),
    ]
}

fn arb_locality() -> impl Strategy<Value = Locality> {
    prop_oneof![
        Just(Locality::Central),
        any::<bool>().prop_map(|accessible| Locality::Node { accessible }),
    ]
}

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn deletion_never_touches_a_volume_it_must_keep(
        volume in arb_pv(),
        claim in arb_claim(),
        publish in any::<bool>(),
        attachment in arb_attachment(),
        locality in arb_locality(),
        class_known in any::<bool>(),
        deleted in any::<bool>(),
    ) {
        let class = sc("fast").param("csi.storage.k8s.io/provisioner-secret-name", "${pv.name}").build();
        let ctx = ReclaimContext {
            driver_name: DRIVER,
            claim,
            publish_unpublish: publish,
            attachment: attachment.clone(),
            locality: locality.clone(),
            storage_class: if class_known { StorageClassLookup::Found(Arc::new(class.clone())) } else { StorageClassLookup::Missing },
            volume_deleted: deleted,
            translated: None,
        };
        let action = decide(&volume, &ctx);
        if let ReclaimAction::DeleteVolume { volume_id, .. } = &action {
            prop_assert!(has_our_finalizer(&volume), "{action:?} without our finalizer");
            prop_assert_eq!(reclaim_policy(&volume), ReclaimPolicy::Delete);
            prop_assert!(is_ours(&volume, DRIVER));
            prop_assert_eq!(Some(volume_id.as_str()), volume.spec.as_ref().and_then(|s| s.csi.as_ref()).map(|c| c.volume_handle.as_str()));
            // A claim that exists or cannot be checked keeps its volume, wherever the decision
            // depends on it (the PV names a claim and does not already say Released).
            if claim_to_check(&volume).is_some() {
                prop_assert_eq!(claim, ClaimState::Gone, "{:?}", action);
            }
            if publish {
                prop_assert_eq!(&attachment, &AttachmentState::Detached);
            }
            let elsewhere = matches!(locality, Locality::Node { accessible: false });
            prop_assert!(!elsewhere, "another node's volume");
        }
        if action == ReclaimAction::AddFinalizer {
            prop_assert!(volume.metadata.deletion_timestamp.is_none());
            prop_assert!(!has_our_finalizer(&volume));
        }
        if matches!(action, ReclaimAction::DeletePvObject { .. }) {
            prop_assert!(deleted, "the PV object goes only after DeleteVolume answered OK");
        }
    }
}
