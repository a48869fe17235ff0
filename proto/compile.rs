// Shared by the build scripts of every crate that speaks CSI (the sidecar, the mock driver and
// csi-sanity): `include!`d, so the three crates generate the same code from one proto file without a
// system `protoc` (protox parses the proto in-process).
fn compile_csi(proto_dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let proto = proto_dir.join("csi.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let fds = protox::compile([&proto], [proto_dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
