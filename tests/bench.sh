#!/usr/bin/env bash
# The benchmark command: what Plexus costs a pod, against a floor that execs the same delegates directly.
# Writes docs/benchmarks.md, docs/benchmarks.png and docs/density.png (overwritten on every run) from
# target/bench/*.json.
#
#   bash tests/bench.sh [--runs N]  (as root)      # default 50 runs per case; about half an hour on 2 cores
#
# Needs root: the real-plugin cases create network namespaces and bridges (and remove them). Not part of
# tests/run.sh. Extra arguments go to plexus-bench (tests/tools/bench; `target/release/plexus-bench --help`).
#
# A section can be measured again alone and put in the same report: `plexus-bench ... --only SECTION --out F`,
# then report.py with the run's results and `--extra F`; the report says when that section was measured.
#
# Multus thick (multus-shim and multus-daemon, v4.3.0) comes with the cluster parts (tests/parts/multus, built
# by tests/parts.sh; the project does not ship it): the daemon section runs the same pods, NADs and delegates
# through Multus in the same run (tests/tools/bench/multus.rs). PLEXUS_BENCH_MULTUS=DIR takes the two binaries
# from DIR instead.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
if [[ $(id -u) != 0 ]]; then
    echo "bench: needs root (network namespaces, bridges, the reference plugins): run bash tests/bench.sh as root" >&2
    exit 1
fi
bash "$here/setup.sh"
cd "$root"
# The node daemon's rows run against a real kube-apiserver (built once per machine, then cached).
PLEXUS_PARTS=$(bash tests/parts.sh)
export PLEXUS_PARTS
export PLEXUS_BENCH_MULTUS=${PLEXUS_BENCH_MULTUS:-$PLEXUS_PARTS}
mkdir -p "${CARGO_TARGET_DIR:-$root/target}"
target=$(cd "${CARGO_TARGET_DIR:-$root/target}" && pwd)

echo "bench: building (release)" >&2
cargo build --release --workspace --bins --examples
# On its own: without the features plexus-node turns on in shared crates (see tests/run.sh).
cargo build --release -p plexus-cni
bash guests/build.sh

# Measure a snapshot: other builds in the same target dir must not swap binaries during the run.
out=$target/bench
snap=$out/bin
rm -rf "$snap" "$out/profile"
mkdir -p "$snap" "$out/profile"
cp "$target/release/plexus" "$target/release/plexus-cni" "$target/release/plexus-bench" "$target/release/examples/hook_bench" "$snap/"

echo "bench: plexus-bench" >&2
"$snap/plexus-bench" --target "$target" --plexus "$snap/plexus" --plexus-cni "$snap/plexus-cni" --out "$out/results.json" "$@"

echo "bench: hook_bench" >&2
PLEXUS_GUESTS_DIR=$target/guests "$snap/hook_bench" >"$out/hook_bench.json"

echo "bench: report" >&2
/usr/bin/python3 "$here/tools/bench/report.py" --results "$out/results.json" --hooks "$out/hook_bench.json" \
    --out "$root/docs/benchmarks.md" --plot "$root/docs/benchmarks.png" --density-plot "$root/docs/density.png"
echo "bench: wrote docs/benchmarks.md and docs/benchmarks.png" >&2
