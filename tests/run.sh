#!/usr/bin/env bash
# The test command: sets up a fresh machine (packages, guest toolchain), builds everything once in the
# release profile, checks style, and runs the whole suite. Needs root (real network namespaces).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

if [ "$(id -u)" != 0 ]; then
    echo "tests/run.sh: run as root: the suite creates network namespaces and runs the CNI reference plugins" >&2
    exit 1
fi

# Each step says how far into the run it starts (seconds), so a slow step shows in CI's log.
step() { printf '\n==> [%ds] %s\n' "$SECONDS" "$*" >&2; }

step "set-up (apt packages, guest toolchain)"
bash tests/setup.sh

step "set-up: Kubernetes, etcd, containerd, CRI-O, cri-tools and the CNI plugins from the Go module proxy (built once per machine, then cached)"
PLEXUS_PARTS=$(bash tests/parts.sh)
export PLEXUS_PARTS

step "style: cargo fmt --check"
cargo fmt --all --check

# The tests run this build's plexus-cni: it compiles no hook whatever it links (entry::Compile::Never), so it
# behaves as the image's, built alone without the compiler (a test reads that build's dependencies from cargo).
# The demo builds with the same command, so after the suite it finds everything built.
step "build: host workspace (release)"
cargo build --release --workspace --bins --examples

step "build: wasm guests -> target/guests/*.wasm"
bash guests/build.sh

step "lint: cargo clippy -D warnings"
cargo clippy --release --workspace --all-targets -- -D warnings

log=$(mktemp /tmp/plexus-tests.XXXXXX)
trap 'rm -f "$log"' EXIT

step "test: guest logic, natively (guests workspace)"
(cd guests && cargo test --release) 2>&1 | tee -a "$log"

step "test: the Python SDK, its template and the Python guests, natively (sdk/python/plexus-py test)"
sdk/python/plexus-py test sdk/python/tests sdk/python/template guests/python/*/ 2>&1 | tee -a "$log"

step "test: the TypeScript SDK, its template and the TypeScript guests, natively (sdk/typescript/plexus-ts test)"
sdk/typescript/plexus-ts test sdk/typescript/tests sdk/typescript/template guests/typescript/*/ 2>&1 | tee -a "$log"

# Four at a time on two cores: most of the suite waits on real processes (API servers, kubelet, containerd, the
# registry, delegates in namespaces) rather than computing; the integration tests are one binary, so they share
# the slots (measured: 177 s with two, 90 s with four).
step "test: host workspace"
status=0
cargo test --release --workspace --no-fail-fast -- --test-threads=4 2>&1 | tee -a "$log" || status=$?

step "done"
# One closing line for the whole run (guests and host), whatever cargo printed last.
awk '/^test result:/ { p += $4; f += $6 } END { printf "plexus: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
