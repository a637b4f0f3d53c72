#!/usr/bin/env bash
# The reliability command: injects teardown faults (kill -9 during ADD and DEL, hung and flooding delegates,
# the API server refused/hung/slow, a full and a read-only cache disk, racing ADD/DEL, many pods at once) and
# counts what leaked; then the node daemon's promises against a real kube-apiserver and registry (an API outage
# while pods are added, kill -9 with status writes pending, a bad NetworkHook applied while pods are added) and
# counts what was lost; then, on a real node (kubelet, containerd and CRI-O, the DaemonSet as installed), pods
# churned through a rolling update, an API outage, a runtime and kubelet restart, a reboot and a full cache disk,
# and what was lost or left. Writes docs/reliability.md (overwritten on every run).
#
#   bash tests/soak.sh [--iterations N] [--pods N] [--daemon-pods N] [--outage-secs N]  (as root)
#       [--node-runtimes containerd,cri-o|none] [--node-churn-secs N]
#   # defaults 200, 64, 100, 60, both runtimes and 20; about half an hour on 2 cores
#
# Needs root: real network namespaces, bridges, the reference plugins, tmpfs mounts. Not part of tests/run.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
if [[ $(id -u) != 0 ]]; then
    echo "soak: needs root (network namespaces, bridges, mounts): run bash tests/soak.sh as root" >&2
    exit 1
fi
bash "$here/setup.sh"
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}

echo "soak: building (release)" >&2
cargo build --release --workspace --bins
bash guests/build.sh
# The node daemon's rows run against a real kube-apiserver (built once per machine, then cached).
PLEXUS_PARTS=$(bash tests/parts.sh)
export PLEXUS_PARTS

out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$target/release/plexus-soak" "$@" >"$out"
cp "$out" "$root/docs/reliability.md"
echo "soak: wrote docs/reliability.md" >&2
