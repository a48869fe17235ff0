use super::*;
use crate::csi::v1::CreateVolumeRequest;
use crate::model::secrets::SecretRef;
use crate::testing::pvc;

fn entry(volume: &str) -> Entry {
    Entry::new(
        &pvc("ns", volume).build(),
        &CreateVolumeRequest {
            name: volume.to_owned(),
            ..CreateVolumeRequest::default()
        },
        Some(&SecretRef::new("creds", "vault")),
        false,
    )
}

#[test]
fn an_entry_is_dropped_once_its_pv_exists_kept_while_its_claim_wants_it() {
    let e = entry("pvc-1");
    let claim = pvc("ns", "pvc-1").build();
    assert_eq!(resolve(&e, &Owner::Me, true, None), Resolution::Drop);
    assert_eq!(
        resolve(&e, &Owner::Me, true, Some(&claim)),
        Resolution::Drop
    );
    assert_eq!(
        resolve(&e, &Owner::Me, false, Some(&claim)),
        Resolution::Keep
    );
    // Bound to this very volume while the PV is not cached (the cache lags, or in node mode it is
    // another node's copy): whose volume it is takes a live read.
    let bound = pvc("ns", "pvc-1").volume_name("pvc-1").build();
    assert_eq!(
        resolve(&e, &Owner::Me, false, Some(&bound)),
        Resolution::CheckPv
    );
}

#[test]
fn a_pv_of_the_entrys_name_holds_another_volume_only_when_the_ids_say_so() {
    let mut e = entry("pvc-1");
    let on_a = crate::testing::pv("pvc-1")
        .annotation(crate::names::ANN_NODE_NAME, "node-a")
        .handle("vol-a")
        .build();
    // Nothing tells them apart: taken to be the entry's, never deleted on a guess.
    assert_eq!(pv_holds_entry(&e, &on_a, None), Holds::Yes);
    assert_eq!(pv_holds_entry(&e, &on_a, Some("node-a")), Holds::Yes);
    // Node mode, another node made the PV: only this node's driver can tell.
    assert_eq!(pv_holds_entry(&e, &on_a, Some("node-b")), Holds::AskDriver);
    // A known id decides, in either mode: another id is another volume...
    e.id = Some("vol-b".to_owned());
    assert_eq!(pv_holds_entry(&e, &on_a, None), Holds::No);
    assert_eq!(pv_holds_entry(&e, &on_a, Some("node-b")), Holds::No);
    // ...and the same id is the same volume, even made by another node (zonal storage).
    e.id = Some("vol-a".to_owned());
    assert_eq!(pv_holds_entry(&e, &on_a, None), Holds::Yes);
    assert_eq!(pv_holds_entry(&e, &on_a, Some("node-b")), Holds::Yes);
}

#[test]
fn an_entry_whose_claim_no_longer_wants_the_volume_is_cleaned_up() {
    let e = entry("pvc-1");
    assert_eq!(
        resolve(&e, &Owner::Me, false, None),
        Resolution::Cleanup(CleanupCause::ClaimGone)
    );
    let recreated = pvc("ns", "pvc-1").uid("another").build();
    assert_eq!(
        resolve(&e, &Owner::Me, false, Some(&recreated)),
        Resolution::Cleanup(CleanupCause::ClaimGone)
    );
    let deleting = pvc("ns", "pvc-1").deleting().build();
    assert_eq!(
        resolve(&e, &Owner::Me, false, Some(&deleting)),
        Resolution::Cleanup(CleanupCause::ClaimDeleting)
    );
    let elsewhere = pvc("ns", "pvc-1").volume_name("static-pv").build();
    assert_eq!(
        resolve(&e, &Owner::Me, false, Some(&elsewhere)),
        Resolution::Cleanup(CleanupCause::BoundElsewhere("static-pv".to_owned()))
    );
}

#[test]
fn node_mode_records_belong_to_the_selected_node() {
    let e = entry("pvc-1");
    let deleting = pvc("ns", "pvc-1").deleting().build();
    let pending = pvc("ns", "pvc-1").build();
    assert_eq!(Owner::of_record(None, Some("n2")), Owner::Me);
    assert_eq!(Owner::of_record(Some("n1"), Some("n1")), Owner::Me);
    let other = Owner::of_record(Some("n1"), Some("n2"));
    assert_eq!(other, Owner::Node("n2".to_owned()));
    // Another node's volume: deleted by that node's instance, or gone with that node.
    assert_eq!(
        resolve(&e, &other, false, Some(&deleting)),
        Resolution::AwaitNodeGone("n2".to_owned())
    );
    assert_eq!(resolve(&e, &other, false, Some(&pending)), Resolution::Keep);
    let elsewhere = pvc("ns", "pvc-1").volume_name("static-pv").build();
    assert_eq!(
        resolve(&e, &other, false, Some(&elsewhere)),
        Resolution::Keep
    );
    // Only a reschedule clears the node, and it follows a final answer: nothing to delete.
    let none = Owner::of_record(Some("n1"), None);
    assert_eq!(none, Owner::NoNode);
    assert_eq!(
        resolve(&e, &none, false, Some(&deleting)),
        Resolution::Forget
    );
    assert_eq!(resolve(&e, &none, false, Some(&pending)), Resolution::Keep);
    // Bound to its recorded volume: accounted for, whoever owns it.
    let bound = pvc("ns", "pvc-1").volume_name("pvc-1").build();
    assert_eq!(resolve(&e, &other, false, Some(&bound)), Resolution::Forget);
    // The PV exists: accounted for, whoever owns it.
    assert_eq!(resolve(&e, &other, true, Some(&deleting)), Resolution::Drop);
}
