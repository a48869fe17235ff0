#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kube-scheduler 1.20.2 from Debian bookworm's
# `kubernetes` source package, for the real-cluster tests (tests/real_cluster.rs). Idempotent: with
# the three binaries in the cache it only checks the packages and exits. Why each step is needed:
# ../shared/reference/real-control-plane.md, summarised in docs/testing.md ("Real control plane").
#
# Cache: ${CSI_PROVISIONER_CACHE:-$HOME/.cache/csi-provisioner}/kubernetes-1.20.2/bin, outside the
# checkout; the tests look there (or in $KUBE_BIN_DIR).
set -euo pipefail

VERSION=1.20.2
CACHE=${CSI_PROVISIONER_CACHE:-$HOME/.cache/csi-provisioner}/kubernetes-$VERSION
BIN=$CACHE/bin
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler)

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else
        echo "error: '$*' needs root" >&2
        return 1
    fi
}

apt_updated=false
apt_update() {
    if [ "$apt_updated" = false ]; then
        as_root apt-get update -qq
        apt_updated=true
    fi
}

# etcd (the store) and openssl (the harness's certificates) are needed to run, not only to build.
need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v openssl >/dev/null 2>&1 || need+=(openssl)

all_built=true
for c in "${COMPONENTS[@]}"; do [ -x "$BIN/$c" ] || all_built=false; done
if [ "$all_built" = true ]; then
    if [ ${#need[@]} -gt 0 ]; then
        apt_update
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need[@]}"
    fi
    echo "real control plane: kubernetes $VERSION already built in $BIN"
    exit 0
fi

GOROOT_119=/usr/lib/go-1.19
REFLECT2=/usr/share/gocode/src/github.com/modern-go/reflect2
[ -x "$GOROOT_119/bin/go" ] || need+=(golang-1.19-go)
[ -d "$REFLECT2" ] || need+=(golang-github-modern-go-reflect2-dev)
command -v dpkg-source >/dev/null 2>&1 || need+=(dpkg-dev)
if [ ${#need[@]} -gt 0 ]; then
    apt_update
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need[@]}"
fi

mkdir -p "$CACHE" "$BIN"
SRC=$CACHE/src/kubernetes-$VERSION
if [ ! -f "$SRC/.prepared" ]; then
    # The source package needs a deb-src entry: the same mirrors and key as the deb entries.
    if ! grep -rqs '^Types:.*deb-src\|^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        echo "adding a deb-src entry for bookworm"
        as_root tee /etc/apt/sources.list.d/csi-provisioner-deb-src.sources >/dev/null <<'SOURCES'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
        apt_updated=false
    fi
    apt_update
    rm -rf "$CACHE/src"
    mkdir -p "$CACHE/src"
    (cd "$CACHE/src" && apt-get source --download-only kubernetes 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
    orig=$(ls "$CACHE"/src/kubernetes_*.orig.tar.gz)
    tar -xzf "$orig" -C "$CACHE/src"
    [ -d "$SRC" ] || { echo "error: $orig did not unpack to $SRC" >&2; exit 1; }

    cd "$SRC"
    # 1. The vendored reflect2 v1.0.1 crashes on Go >= 1.18 (map iteration): use Debian's 1.0.2.
    rm -rf vendor/github.com/modern-go/reflect2
    mkdir -p vendor/github.com/modern-go/reflect2
    cp "$REFLECT2"/*.go "$REFLECT2"/*.s vendor/github.com/modern-go/reflect2/ 2>/dev/null || cp "$REFLECT2"/*.go vendor/github.com/modern-go/reflect2/
    rm -f vendor/github.com/modern-go/reflect2/*_test.go
    sed -i "s|=> github.com/modern-go/reflect2 v1.0.1|=> github.com/modern-go/reflect2 v1.0.2|" go.mod vendor/modules.txt
    # 2. Go 1.19 reads a wildcard replacement line ("# mod => mod vX") placed between a module's
    #    header and its packages as ending that module; `go mod vendor` puts them last.
    awk '$1 == "#" && $3 == "=>" { tail[n++] = $0; next } { print } END { for (i = 0; i < n; i++) print tail[i] }' \
        vendor/modules.txt >vendor/modules.txt.new
    mv vendor/modules.txt.new vendor/modules.txt
    touch .prepared
fi

cd "$SRC"
export PATH=$GOROOT_119/bin:$PATH GOTOOLCHAIN=local GOPROXY=off CGO_ENABLED=0
export GOCACHE=$CACHE/go-build GOFLAGS=-mod=vendor

# 3. The generated OpenAPI definitions are not in the tarball: generate them as
#    Makefile.generated_files does (GOPATH mode, every package tagged +k8s:openapi-gen=).
OPENAPI=pkg/generated/openapi/zz_generated.openapi.go
if [ ! -f "$OPENAPI" ]; then
    echo "generating $OPENAPI"
    go build -o "$CACHE/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
    GOPATH=$CACHE/gopath
    mkdir -p "$GOPATH/src/k8s.io"
    ln -sfn "$SRC" "$GOPATH/src/k8s.io/kubernetes"
    # vendor/k8s.io/* are symbolic links into staging/, where find sees the files.
    inputs=$(find . -path ./_output -prune -o -name '*.go' ! -name '*_test.go' -print0 |
        { xargs -0 grep -l '^// *+k8s:openapi-gen=' || true; } | xargs -n1 dirname | LC_ALL=C sort -u |
        sed -e 's|^\./staging/src/|./vendor/|' -e 's|^\./|k8s.io/kubernetes/|' | LC_ALL=C sort -u | paste -sd, -)
    (cd "$GOPATH/src/k8s.io/kubernetes" && GOPATH=$GOPATH GO111MODULE=off GOFLAGS= "$CACHE/openapi-gen" \
        --input-dirs "$inputs" \
        --output-package k8s.io/kubernetes/pkg/generated/openapi \
        --output-file-base zz_generated.openapi \
        --go-header-file vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
        --output-base "$GOPATH/src" \
        --report-filename "$CACHE/openapi-api-rules.report")
    [ -f "$OPENAPI" ] || { echo "error: openapi-gen wrote no $OPENAPI" >&2; exit 1; }
fi

# The version stamp: without it the binaries say v0.0.0 and version-checking clients get confused.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=v$VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=20"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
for c in "${COMPONENTS[@]}"; do
    [ -x "$BIN/$c" ] && continue
    echo "building $c $VERSION (a few minutes on 2 cores)"
    go build -trimpath -ldflags "$ldflags" -o "$BIN/$c.tmp" "./cmd/$c"
    mv "$BIN/$c.tmp" "$BIN/$c"
done
"$BIN/kube-apiserver" --version
echo "real control plane: kubernetes $VERSION built in $BIN"
