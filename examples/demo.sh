#!/usr/bin/env bash
# The Plexus demo: on a fresh machine, as root, installs what it needs, builds plexus, and runs
# ADD -> CHECK -> DEL for a pod through plexus with the real CNI reference plugins in a real network namespace,
# showing the pod's interfaces and its network-status. Cleans up after itself.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
[ "$(id -u)" = 0 ] || { echo "examples/demo.sh: run as root (it creates a network namespace)" >&2; exit 1; }

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }

bold "1. set-up and build"
bash tests/setup.sh
# The same build as the test command's (tests/run.sh): after the suite, nothing is built again.
cargo build --release --workspace --bins --examples
plexus=$root/target/release/plexus

state=$(mktemp -d /tmp/plexus-demo.XXXXXX)
netns=plexus-demo-$$
cleanup() {
    ip netns del "$netns" 2>/dev/null || true
    for br in plxdemo0 plxdemo1 plxdemo2; do ip link del "$br" 2>/dev/null || true; done
    rm -rf "$state"
}
trap cleanup EXIT
mkdir -p "$state/net.d" "$state/cluster"
sed "s|@STATE@|$state|g" examples/demo/cluster-network.conflist > "$state/net.d/10-demo-cluster.conflist"
sed "s|@STATE@|$state|g" examples/demo/manifests.yaml > "$state/cluster/manifests.yaml"
ip netns add "$netns"

conf=$(cat <<JSON
{"cniVersion": "1.0.0", "name": "plexus", "type": "plexus",
 "clusterNetwork": "demo-cluster", "confDir": "$state/net.d",
 "cacheDir": "$state/cache", "runDir": "$state/run",
 "cluster": {"source": "files", "dir": "$state/cluster"},
 "logFile": "$state/plexus.log", "logLevel": "debug",
 "runtimeConfig": {"bandwidth": {"ingressRate": 100000000, "ingressBurst": 1000000, "egressRate": 100000000, "egressBurst": 1000000}}}
JSON
)
cni() {
    CNI_COMMAND=$1 CNI_CONTAINERID=demo-$$ CNI_NETNS=/run/netns/$netns CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web;K8S_POD_UID=6b3f8a52-demo-4c1e-9d7e-2f1a0c9e5b10" \
        "$plexus" <<<"$conf"
}

bold "2. the pod's selection annotation (k8s.v1.cni.cncf.io/networks)"
sed -n '/networks: |/,/^---/p' "$state/cluster/manifests.yaml" | sed '1d;$d'

bold "3. ADD: plexus attaches the cluster network, then blue and red (result printed to the runtime):"
cni ADD | jq .

bold "4. inside the pod's network namespace:"
ip -n "$netns" -br addr show | grep -v '^lo'
ip -n "$netns" route show

bold "5. the network-status annotation plexus published (k8s.v1.cni.cncf.io/network-status):"
jq . "$state/cluster/status/demo/web.json"

bold "6. CHECK: every attachment is verified by its plugins"
cni CHECK && echo "CHECK ok"

bold "7. DEL: everything is torn down, in reverse"
cni DEL && echo "DEL ok"
echo "interfaces left in the pod: $(ip -n "$netns" -br link show | grep -vc '^lo' || true)"
echo "IP reservations left: $(find "$state/ipam" -type f -name '[0-9]*' | wc -l)"
echo "attachment cache files left: $(find "$state/cache/attachments" -type f | wc -l)"

bold "from plexus's log (every delegate call; delegate stderr is kept there too):"
grep -E "exec delegate|delegate stderr" "$state/plexus.log" | cut -c29- | head -n 12
