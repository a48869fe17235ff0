use super::*;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

fn claim(name: &str, rv: &str) -> Lean<PersistentVolumeClaim> {
    let mut c = PersistentVolumeClaim::default();
    c.metadata.name = Some(name.to_owned());
    c.metadata.namespace = Some("ns".to_owned());
    c.metadata.resource_version = Some(rv.to_owned());
    Lean::new(c)
}

#[tokio::test]
async fn a_relist_replaces_the_content_and_updates_replace_entries() {
    let (cache, mut writer) = cache();
    writer.apply(watcher::Event::Init);
    writer.apply(watcher::Event::InitApply(claim("a", "1")));
    writer.apply(watcher::Event::InitApply(claim("b", "1")));
    assert_eq!(cache.len(), 0, "a list shows only once complete");
    let announced = writer.apply(watcher::Event::InitDone);
    assert_eq!(announced.len(), 2);
    cache.wait_until_ready().await.unwrap();

    let changed = writer.apply(watcher::Event::Apply(claim("a", "2")));
    assert_eq!(changed.len(), 1);
    assert_eq!(cache.get("ns/a").unwrap().resource_version(), "2");
    assert!(cache.get("a").is_none(), "the key carries the namespace");

    // The watch was down while b was deleted and c created: the re-list drops b.
    writer.apply(watcher::Event::Init);
    writer.apply(watcher::Event::InitApply(claim("a", "3")));
    writer.apply(watcher::Event::InitApply(claim("c", "1")));
    assert!(
        cache.get("ns/b").is_some(),
        "the old content serves until the list completes"
    );
    writer.apply(watcher::Event::InitDone);
    assert!(cache.get("ns/b").is_none());
    assert_eq!(cache.len(), 2);

    writer.apply(watcher::Event::Delete(claim("c", "1")));
    assert!(cache.get("ns/c").is_none());
    assert_eq!(cache.state().len(), 1);
}

#[tokio::test]
async fn waiting_for_a_cache_whose_watch_stopped_fails_instead_of_hanging() {
    let (cache, writer) = cache::<PersistentVolumeClaim>();
    drop(writer);
    assert!(cache.wait_until_ready().await.is_err());
}
