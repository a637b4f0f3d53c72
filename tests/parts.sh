#!/usr/bin/env bash
# Builds the real cluster parts the tests run, from the Go module proxy, once per machine, and prints the directory
# that holds them:
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd   (tests/parts/kubernetes)
#   dra-driver, the DRA kubelet plugin of the suite's network devices (the project's own, same module)
#   containerd containerd-shim-runc-v2 ctr                                       (tests/parts/containerd)
#   crictl critest                                                               (tests/parts/cri-tools)
#   cni/<plugin>, the CNI reference plugins                                      (tests/parts/cni-plugins)
#   multus-shim multus-daemon, Multus thick, for the benchmarks' side-by-side runs (tests/parts/multus)
#   crio pinns, CRI-O, the second runtime the node tests run on                  (tests/parts/cri-o)
# Each is a Go module of the project's own (tests/parts/*) whose go.mod pins the release (and, for Kubernetes, every k8s.io staging
# module at the matching v0.x) and whose go.sum is committed; the programs are its `tool` entries. One `go build`
# per module, so the packages its programs share compile once; Go's build cache is kept beside the binaries, so a
# rebuild after a version change compiles only what changed.
#
# Cache: PLEXUS_PARTS_CACHE (default /var/cache/plexus-tests), one directory per content of the five modules and
# the Go version; a later run only checks the binaries. Runs Go as found on PATH (1.26 on the project's machines).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
parts="$root/tests/parts"
CACHE=${PLEXUS_PARTS_CACHE:-/var/cache/plexus-tests}
log() { echo "parts: $*" >&2; }

# The project's machines have Go 1.26 first on PATH, installed at /usr/local/go.
command -v go >/dev/null || PATH=/usr/local/go/bin:$PATH
command -v go >/dev/null || { log "no go on PATH (the project's machines have Go 1.26 at /usr/local/go)"; exit 1; }
key=$( { go env GOVERSION; find "$parts" -type f | LC_ALL=C sort | xargs cat; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)
OUT="$CACHE/parts-$key"

want=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd dra-driver
      containerd containerd-shim-runc-v2 ctr crictl critest
      cni/bridge cni/host-local cni/static cni/loopback cni/portmap cni/bandwidth cni/tuning cni/macvlan
      multus-shim multus-daemon crio pinns)
complete() { local b; for b in "${want[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done; }
if complete; then
  echo "$OUT"
  exit 0
fi

# Go's own caches live beside the binaries: no dependence on $HOME, and a second build reuses the first's work.
export GOPATH="$CACHE/go" GOCACHE="$CACHE/go-build" GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
export CGO_ENABLED=0
mkdir -p "$CACHE"
export parts tmp="$OUT.tmp"
rm -rf "$tmp"
mkdir -p "$tmp/cni"

# timed WHAT FUNCTION: runs the function in a shell of its own, bounded (an hour), printing how long it took.
timed() {
  local what=$1 fn=$2 start=$SECONDS
  log "$what"
  if ! timeout 3600 bash -euo pipefail -c "$(declare -f "$fn"); $fn" >"$tmp/build.log" 2>&1; then
    tail -n 40 "$tmp/build.log" >&2
    log "$what: failed"
    exit 1
  fi
  log "$what: $((SECONDS - start)) s"
}

# Every module the six need, with checksums checked against the committed go.sum files.
download() { local m; for m in kubernetes containerd cri-tools cni-plugins multus cri-o; do (cd "$parts/$m" && go mod download); done; }
timed "downloading modules" download

# The version Kubernetes' own release build stamps (kubectl version, the Node's kubeletVersion).
kver=$(cd "$parts/kubernetes" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
kminor=${kver#v1.}
kminor=${kminor%%.*}
vpkg=k8s.io/component-base/version
export kflags="-s -w -X $vpkg.gitVersion=$kver -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$kminor -X $vpkg.gitTreeState=clean"
build_kubernetes() {
  cd "$parts/kubernetes"
  go build -ldflags "$kflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
  go build -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
  go build -ldflags "-s -w" -o "$tmp/dra-driver" ./dra-driver
}
timed "building Kubernetes $kver and etcd" build_kubernetes

build_containerd() {
  cd "$parts/containerd"
  # no_btrfs: no libbtrfs headers needed (the tests use the overlayfs/native snapshotters).
  go build -tags "no_btrfs urfave_cli_no_docs" -ldflags "-s -w" -o "$tmp/" \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr
  go build -tags "no_btrfs no_grpc urfave_cli_no_docs" -ldflags "-s -w" -o "$tmp/" \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
}
timed "building containerd $(cd "$parts/containerd" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)" build_containerd

build_critools() {
  cd "$parts/cri-tools"
  local v
  v=$(go list -m -f '{{.Version}}' sigs.k8s.io/cri-tools)
  go build -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$v" -o "$tmp/" sigs.k8s.io/cri-tools/cmd/crictl
  # critest is a test binary of Ginkgo specs, built as cri-tools' own Makefile builds it.
  go test -c -ldflags "-s -w" -o "$tmp/critest" sigs.k8s.io/cri-tools/cmd/critest
}
timed "building cri-tools $(cd "$parts/cri-tools" && go list -m -f '{{.Version}}' sigs.k8s.io/cri-tools)" build_critools

build_plugins() {
  cd "$parts/cni-plugins"
  # The module's tool entries are the plugins.
  # shellcheck disable=SC2046
  go build -ldflags "-s -w" -o "$tmp/cni/" $(sed -n '/^tool (/,/^)/{/^\t/p}' go.mod)
}
timed "building the CNI plugins $(cd "$parts/cni-plugins" && go list -m -f '{{.Version}}' github.com/containernetworking/plugins)" build_plugins

build_multus() {
  cd "$parts/multus"
  local m=gopkg.in/k8snetworkplumbingwg/multus-cni.v4 v
  v=$(go list -m -f '{{.Version}}' "$m")
  # The version its release build stamps (multus-daemon -version).
  # shellcheck disable=SC2046
  go build -ldflags "-s -w -X $m/pkg/multus.version=$v" -o "$tmp/" $(sed -n '/^tool (/,/^)/{/^\t/p}' go.mod)
}
timed "building Multus $(cd "$parts/multus" && go list -m -f '{{.Version}}' gopkg.in/k8snetworkplumbingwg/multus-cni.v4)" build_multus

build_crio() {
  cd "$parts/cri-o"
  local m=github.com/cri-o/cri-o src
  v=$(go list -m -f '{{.Version}}' "$m")
  # cgo on, as CRI-O's own build; the tags its Makefile picks on a machine without the btrfs, gpgme, seccomp,
  # apparmor and selinux libraries (ostree is a stub in every build).
  CGO_ENABLED=1 go build -tags "containers_image_ostree_stub exclude_graphdriver_btrfs btrfs_noversion containers_image_openpgp" \
    -ldflags "-s -w" -o "$tmp/" "$m/cmd/crio"
  # pinns (it makes a pod's namespaces) is C in the same module: built with its own Makefile, static, in a
  # writable copy of the module's source.
  src=$(go list -m -f '{{.Dir}}' "$m")
  mkdir -p "$tmp/pinns-src"
  cp -r "$src/pinns" "$tmp/pinns-src/"
  chmod -R u+w "$tmp/pinns-src"
  make -C "$tmp/pinns-src/pinns"
  mv "$tmp/pinns-src/bin/pinns" "$tmp/pinns"
  rm -rf "$tmp/pinns-src"
}
timed "building CRI-O $(cd "$parts/cri-o" && go list -m -f '{{.Version}}' github.com/cri-o/cri-o)" build_crio

rm -f "$tmp/build.log"
rm -rf "$OUT"
mv "$tmp" "$OUT"
complete || { log "built, but $OUT lacks some of: ${want[*]}"; exit 1; }
# Builds of other versions are not used again (Go's build cache keeps what a rebuild needs).
for old in "$CACHE"/parts-*; do
  [[ $old == "$OUT" || $old == *.tmp ]] || rm -rf "$old"
done
log "built $OUT"
echo "$OUT"
