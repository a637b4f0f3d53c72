#!/usr/bin/env bash
# Installs everything Plexus's demo, tests and benchmarks need on a fresh Debian machine of the project's kind.
# Idempotent: packages already present are not fetched again. Must run as root.
set -euo pipefail

PKGS=(
  # the CNI reference plugins (bridge, host-local, static, tuning, bandwidth) for the demo; the tests run release
  # v1.10.0 of tests/parts.sh
  containernetworking-plugins
  # the reference runtime library libcni, for the Go client driver used in tests
  golang-go golang-github-appc-cni-dev
  # network namespaces, veth, routes; the plugins' iptables/tc needs
  iproute2 iptables nftables
  # the Debian route to wasm32-wasip1 guests (see ../shared/guest-toolchain.md)
  rustc-web cargo-web rust-web-src lld-22 wasi-libc
  # Python hooks: the venv that holds the pinned componentize-py (sdk/python/venv.sh, below)
  python3 python3-venv
  # runc under containerd 2 and CRI-O (tests/parts.sh builds both), CRI-O's conmon, and a static busybox for the
  # images the tests build
  runc conmon busybox-static
  # TLS keys for the API server, HTTP to it and to etcd (tests/parts.sh builds both)
  openssl curl
  # hook distribution: the CNCF distribution registry (docker-registry) as the OCI registry, on loopback
  docker-registry
  # promtool (Prometheus's checker) for the metrics endpoint's output and the example alert rules; the
  # package's server is not started
  prometheus
  # benchmarks: plots and profiles
  python3-matplotlib valgrind
  jq
  # GNU time: the peak memory of one plexus process (the flood test), which the suite's own process would skew
  time
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python hook toolchain (sdk/python/requirements.lock) in a venv of its own, from PyPI, once per pin.
bash "$(dirname "${BASH_SOURCE[0]}")/../sdk/python/venv.sh" >/dev/null

# The TypeScript hook toolchain (sdk/typescript/package-lock.json) with npm ci, once per pin. It needs Node 20 or
# later with npm on PATH; this script does not install them.
bash "$(dirname "${BASH_SOURCE[0]}")/../sdk/typescript/node-env.sh" >/dev/null

# The reference plugins keep IPAM state under /var/lib/cni; make sure the directory exists.
mkdir -p /var/lib/cni /run/netns
echo "setup: ok" >&2
