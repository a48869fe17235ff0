use super::*;

#[test]
fn provisioner_identity_has_upstreams_shape() {
    let id = provisioner_identity("drv.example.com", None);
    let parts: Vec<&str> = id.splitn(3, '-').collect();
    assert_eq!(parts.len(), 3);
    assert!(parts[0].parse::<u128>().is_ok());
    assert!(parts[1].parse::<u32>().unwrap() < 10_000);
    assert_eq!(parts[2], "drv.example.com");
    assert!(provisioner_identity("d", Some("n1")).ends_with("-d-n1"));
}
