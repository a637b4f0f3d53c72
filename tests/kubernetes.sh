#!/usr/bin/env bash
# Builds a real kube-apiserver and kubelet (1.20.2, from Debian's `kubernetes` source package) once per machine,
# fetches Debian's kubectl of the same release, and prints the directory that holds the three. The tests run the
# API server with Debian's etcd to exercise the node daemon's watches against the API server's own semantics
# (resourceVersions, 410 Gone, bookmarks, field selectors) and to apply the project's CRDs and RBAC as written;
# the kubelet, over a private containerd, runs pods through Plexus as a node does.
#
# Both come from one `make` (the packages they share compile once). The binaries are cached under
# PLEXUS_KUBE_CACHE (default /var/cache/plexus-tests): a later run only checks them.
# Must run as root (apt). About 10 minutes on 2 cores the first time.
set -euo pipefail

CACHE=${PLEXUS_KUBE_CACHE:-/var/cache/plexus-tests}
VERSION=1.20.2
OUT="$CACHE/kubernetes-$VERSION"
log() { echo "kubernetes: $*" >&2; }

# kubectl: Debian's kubernetes-client package of the same release, unpacked rather than installed (a machine may
# have another kubectl at /usr/bin/kubectl).
fetch_kubectl() {
  [[ -x "$OUT/kubectl" ]] && return 0
  local tmp
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/plexus-kubectl.XXXXXX")
  (cd "$tmp" && timeout 600 apt-get download -qq kubernetes-client 2>/dev/null) || {
    timeout 600 apt-get update -qq && (cd "$tmp" && timeout 600 apt-get download -qq kubernetes-client 2>/dev/null)
  } || { rm -rf "$tmp"; log "could not download kubernetes-client"; return 1; }
  dpkg-deb -x "$tmp"/kubernetes-client_*.deb "$tmp/x"
  install -m 0755 "$tmp/x/usr/bin/kubectl" "$OUT/kubectl.tmp"
  mv "$OUT/kubectl.tmp" "$OUT/kubectl"
  rm -rf "$tmp"
}

if [[ -x "$OUT/kube-apiserver" && -x "$OUT/kubelet" && -x "$OUT/kube-controller-manager" ]]; then
  fetch_kubectl
  echo "$OUT"
  exit 0
fi

pkgs=(golang-go etcd-server rsync jq golang-github-modern-go-reflect2-dev dpkg-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# Source packages come from the same mirror and suite as the machine's binary packages.
SRC_LIST=/etc/apt/sources.list.d/plexus-tests-src.sources
if [[ ! -f $SRC_LIST ]]; then
  main=/etc/apt/sources.list.d/debian.sources
  [[ -f $main ]] || { log "no $main to derive a deb-src entry from"; exit 1; }
  # The first stanza of the Debian entries (the main archive), retyped as deb-src.
  awk 'BEGIN{RS=""; ORS="\n\n"} NR==1 { sub(/Types: deb/, "Types: deb-src"); print }' "$main" >"$SRC_LIST"
  missing+=("__update")
fi
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  log "installing build tools"
  apt-get update -qq
  real=()
  for p in "${missing[@]}"; do [[ $p == __update ]] || real+=("$p"); done
  if ((${#real[@]})); then apt-get install -y -qq --no-install-recommends "${real[@]}" >/dev/null; fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/plexus-kube-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
log "fetching the kubernetes source package"
timeout 600 apt-get source --download-only -qq kubernetes >/dev/null
orig=$(ls kubernetes_*.orig.tar.gz | head -n1)
mkdir src
tar -xzf "$orig" -C src --strip-components=1
cd src

# Vendored reflect2 1.0.1 faults under Go >= 1.18 on the first map it encodes; Debian ships 1.0.2.
r2=/usr/share/gocode/src/github.com/modern-go/reflect2
rm -f vendor/github.com/modern-go/reflect2/*.go vendor/github.com/modern-go/reflect2/*.s
cp "$r2"/*.go vendor/github.com/modern-go/reflect2/
cp "$r2"/*.s vendor/github.com/modern-go/reflect2/ 2>/dev/null || true
rm -f vendor/github.com/modern-go/reflect2/*_test.go

mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
log "building kube-apiserver, kubelet and kube-controller-manager (about 10 minutes on 2 cores)"
# Debian's Go (golang-go): the 1.20 tree's GOPATH build and vendored code predate the Go first on PATH.
PATH=/usr/lib/go/bin:$PATH GOPATH=$PWD/.go CGO_ENABLED=0 \
  timeout 3000 make WHAT="cmd/kube-apiserver cmd/kubelet cmd/kube-controller-manager" >"$work/build.log" 2>&1 || {
  tail -n 40 "$work/build.log" >&2
  log "build failed"
  exit 1
}
mkdir -p "$OUT.tmp"
cp _output/bin/kube-apiserver _output/bin/kubelet _output/bin/kube-controller-manager "$OUT.tmp/"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
log "built $OUT/kube-apiserver, $OUT/kubelet and $OUT/kube-controller-manager"
fetch_kubectl
echo "$OUT"
