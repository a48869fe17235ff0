use super::*;
use k8s_openapi::api::storage::v1::{VolumeAttachmentSource, VolumeAttachmentSpec};
use kube::api::ObjectMeta;

pub(crate) fn va(name: &str, pv: &str, node: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: "drv".into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                ..Default::default()
            },
        },
        status: None,
    }
}

#[test]
fn attachment_index_follows_applies_deletes_and_relists() {
    let index = AttachmentIndex::default();
    assert!(!index.is_ready());
    index.apply(&watcher::Event::Init);
    index.apply(&watcher::Event::InitApply(va("a1", "pv1", "n1")));
    index.apply(&watcher::Event::InitDone);
    assert!(index.is_ready());
    assert_eq!(index.attached_node("pv1").as_deref(), Some("n1"));
    assert_eq!(index.attached_node("pv2"), None);

    // An attachment re-pointed at another PV leaves no stale entry behind.
    index.apply(&watcher::Event::Apply(va("a1", "pv2", "n2")));
    assert_eq!(index.attached_node("pv1"), None);
    assert_eq!(index.attached_node("pv2").as_deref(), Some("n2"));

    index.apply(&watcher::Event::Delete(va("a1", "pv2", "n2")));
    assert_eq!(index.attached_node("pv2"), None);

    // A re-list replaces the whole index, dropping attachments deleted while disconnected.
    index.apply(&watcher::Event::Apply(va("a3", "pv3", "n3")));
    index.apply(&watcher::Event::Init);
    index.apply(&watcher::Event::InitApply(va("a4", "pv4", "n4")));
    assert_eq!(index.attached_node("pv3").as_deref(), Some("n3"));
    index.apply(&watcher::Event::InitDone);
    assert_eq!(index.attached_node("pv3"), None);
    assert_eq!(index.attached_node("pv4").as_deref(), Some("n4"));
}

#[tokio::test]
async fn detachments_name_each_pv_whose_last_attachment_goes() {
    let index = AttachmentIndex::default();
    let mut detached = index.detachments();
    index.apply(&watcher::Event::Init);
    index.apply(&watcher::Event::InitApply(va("a1", "pv1", "n1")));
    index.apply(&watcher::Event::InitApply(va("a2", "pv1", "n2")));
    index.apply(&watcher::Event::InitApply(va("a3", "pv3", "n1")));
    index.apply(&watcher::Event::InitDone);
    // pv1 keeps one attachment: not announced yet.
    index.apply(&watcher::Event::Delete(va("a1", "pv1", "n1")));
    index.apply(&watcher::Event::Delete(va("a2", "pv1", "n2")));
    assert_eq!(detached.next().await.as_deref(), Some("pv1"));
    // pv3's attachment disappears during a re-list.
    index.apply(&watcher::Event::Init);
    index.apply(&watcher::Event::InitDone);
    assert_eq!(detached.next().await.as_deref(), Some("pv3"));
    assert!(futures::FutureExt::now_or_never(detached.next()).is_none());
}
