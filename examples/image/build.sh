#!/usr/bin/env bash
# Builds Plexus's container image as an OCI image layout tar, with Debian's tools only (tar, coreutils, jq):
# no container engine is needed. The image holds /usr/local/bin/plexus (`plexus daemon`, `plexus install`,
# `plexus hook`: the node's long-running process), /usr/local/bin/plexus-cni (the CNI plugin alone, without
# the wasm compiler: what the DaemonSet installs onto the node as `plexus`), nsenter and ip, the shared libraries
# they link,
# and the system's CA bundle (for registries and API servers over TLS). It runs as root; the DaemonSet gives
# the command.
#
#   examples/image/build.sh [--binary PATH] [--cni-binary PATH] [--out FILE] [--name NAME:TAG]
#
# Without --binary / --cni-binary they are built with the shipped profiles (`cargo build --profile dist -p
# plexus` and `--profile dist-cni -p plexus-cni`: fat LTO, one codegen unit, stripped; the CNI plugin also
# size-optimised without unwinding; ~20 minutes on 2 cores). The result imports into containerd with
#   ctr -n k8s.io images import FILE
# and any OCI tool reads it (skopeo copy oci-archive:FILE docker://REGISTRY/plexus:TAG pushes it).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
binary=""
cni_binary=""
out="$target/image/plexus-image.tar"
name="example.invalid/plexus:0.1.0"

while (($#)); do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --cni-binary) cni_binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $name in
  *:*) tag=${name##*:} ;;
  *) echo "build.sh: --name needs a tag (NAME:TAG)" >&2; exit 2 ;;
esac

if [[ -z $binary ]]; then
  (cd "$root" && cargo build --profile dist -p plexus --bin plexus)
  binary=$target/dist/plexus
fi
if [[ -z $cni_binary ]]; then
  # Alone, so that features plexus-node turns on in shared crates (the wasm compiler) are not unified into it.
  (cd "$root" && cargo build --profile dist-cni -p plexus-cni)
  cni_binary=$target/dist-cni/plexus-cni
fi
for b in "$binary" "$cni_binary"; do
  [[ -x $b ]] || { echo "build.sh: $b is not an executable" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
mkdir -p "$rootfs/usr/local/bin" "$rootfs/tmp" "$rootfs/etc/ssl/certs" "$rootfs/var/lib/plexus" "$rootfs/run/plexus"
chmod 1777 "$rootfs/tmp"
install -m 0755 "$binary" "$rootfs/usr/local/bin/plexus"
install -m 0755 "$cni_binary" "$rootfs/usr/local/bin/plexus-cni"
# Debug information stays out of the image (the dist profiles already strip; a release build does not).
if command -v strip >/dev/null; then
  strip --strip-all "$rootfs/usr/local/bin/plexus" "$rootfs/usr/local/bin/plexus-cni"
fi

# The tools a change inside a pod's network namespace runs (`nsenter --net=NETNS ip ...`): the daemon's NRI mode
# reads the cluster network's interface with them, and a pod's default-route selection sets its routes. Debian's
# (util-linux, iproute2), from the building machine.
tools=()
for tool in nsenter ip; do
  path=$(command -v "$tool") || { echo "build.sh: $tool is not installed" >&2; exit 1; }
  install -D -m 0755 "$path" "$rootfs/usr/bin/$tool"
  tools+=("$path")
done

# The shared libraries the binaries link (glibc's loader, libc, libm, libgcc_s; ip's libbpf, libelf, libmnl...), at
# the paths they ask for.
cat <(ldd "$binary") <(ldd "$cni_binary") <(for t in "${tools[@]}"; do ldd "$t"; done) |
  grep -o '/[^ ]*' | sort -u | while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
fi
printf 'root:x:0:0:root:/:/usr/local/bin/plexus\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\n' >"$rootfs/etc/group"

layout=$work/layout
blobs=$layout/blobs/sha256
mkdir -p "$blobs"
# put FILE: stores FILE as a blob; prints "sha256:<hex> <size>".
put() {
  local sum size
  sum=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  cp "$1" "$blobs/$sum"
  echo "sha256:$sum $size"
}

# One layer, reproducible: sorted names, fixed owner and times.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .
read -r layer_digest layer_size < <(put "$work/layer.tar")

jq -n --arg layer "$layer_digest" '{
  architecture: "amd64", os: "linux",
  config: {
    Entrypoint: ["/usr/local/bin/plexus"],
    Env: ["PATH=/usr/local/bin:/usr/bin:/bin"],
    WorkingDir: "/"
  },
  rootfs: {type: "layers", diff_ids: [$layer]}
}' >"$work/config.json"
read -r config_digest config_size < <(put "$work/config.json")

jq -n --arg c "$config_digest" --argjson cs "$config_size" --arg l "$layer_digest" --argjson ls "$layer_size" '{
  schemaVersion: 2,
  mediaType: "application/vnd.oci.image.manifest.v1+json",
  config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $cs},
  layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $l, size: $ls}]
}' >"$work/manifest.json"
read -r manifest_digest manifest_size < <(put "$work/manifest.json")

jq -n --arg m "$manifest_digest" --argjson ms "$manifest_size" --arg name "$name" --arg tag "$tag" '{
  schemaVersion: 2,
  manifests: [{
    mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $m, size: $ms,
    platform: {architecture: "amd64", os: "linux"},
    annotations: {"io.containerd.image.name": $name, "org.opencontainers.image.ref.name": $tag}
  }]
}' >"$layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"

mkdir -p "$(dirname "$out")"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layout" -cf "$out.tmp" oci-layout index.json blobs
mv "$out.tmp" "$out"
echo "image $name: $out (manifest $manifest_digest, plexus $(stat -c %s "$rootfs/usr/local/bin/plexus") bytes, plexus-cni $(stat -c %s "$rootfs/usr/local/bin/plexus-cni") bytes, layer $layer_size bytes)" >&2
