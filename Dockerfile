# Multi-stage build of the sidecar image. The runtime image has no shell, like upstream's
# distroless image, and runs as root by default so that it can open the driver's socket.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# No protoc needed: build.rs compiles proto/csi.proto with protox.
RUN cargo build --release --locked --package csi-provisioner --bin csi-provisioner \
    && cp target/release/csi-provisioner /csi-provisioner

FROM gcr.io/distroless/cc-debian12
LABEL description="CSI external-provisioner (Rust drop-in replacement)"
COPY --from=build /csi-provisioner /csi-provisioner
ENTRYPOINT ["/csi-provisioner"]
