use super::*;

fn path_of(address: &str) -> PathBuf {
    Endpoint::parse(address)
        .map(|e| e.path().to_path_buf())
        .unwrap()
}

#[test]
fn accepts_the_unix_socket_forms_manifests_use() {
    assert_eq!(path_of("/run/csi/socket"), PathBuf::from("/run/csi/socket"));
    assert_eq!(
        path_of("unix:///run/csi/socket"),
        PathBuf::from("/run/csi/socket")
    );
    assert_eq!(
        path_of("unix:/run/csi/socket"),
        PathBuf::from("/run/csi/socket")
    );
    assert_eq!(path_of("unix:csi.sock"), PathBuf::from("csi.sock"));
    assert_eq!(path_of("  /csi/csi.sock\n"), PathBuf::from("/csi/csi.sock"));
}

#[test]
fn rejects_what_is_not_a_unix_socket_with_a_hint() {
    assert_eq!(Endpoint::parse(""), Err(EndpointError::Empty));
    assert_eq!(Endpoint::parse("unix://"), Err(EndpointError::Empty));
    for address in [
        "localhost:10000",
        "tcp://127.0.0.1:9000",
        "dns:///csi",
        "csi.sock",
    ] {
        let err = Endpoint::parse(address).unwrap_err();
        assert_eq!(err, EndpointError::UnsupportedScheme(address.into()));
        assert!(
            err.to_string().contains("only /path, unix:///path"),
            "{err}"
        );
    }
    let err = Endpoint::parse("unix://host/csi.sock").unwrap_err();
    assert_eq!(
        err,
        EndpointError::HasAuthority("unix://host/csi.sock".into())
    );
    assert!(err.to_string().contains("three slashes"), "{err}");
}

#[test]
fn displays_as_the_socket_path() {
    assert_eq!(
        Endpoint::parse("unix:///x/y.sock").unwrap().to_string(),
        "/x/y.sock"
    );
}
