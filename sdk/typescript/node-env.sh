#!/usr/bin/env bash
# Makes (once) the Node environment that builds TypeScript hooks, and prints its directory: node_modules with the
# pinned toolchain of package-lock.json (componentize-js, jco, typescript), installed with `npm ci`, which checks
# every package against the lock's integrity hash. One directory per content of the lock and per Node version, so
# a changed pin gets a new one and an unchanged one is only checked.
#
# Where: $PLEXUS_TS_ENV_DIR if set; else under /var/cache/plexus-tests (the suite's cache, as tests/parts.sh) when
# it is writable; else under the repository's target directory. Needs node (20 or later) and npm.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
log() { echo "typescript-sdk: $*" >&2; }

command -v node >/dev/null && command -v npm >/dev/null || { log "no node/npm on PATH"; exit 1; }
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
    || { log "node $(node --version) is older than 20"; exit 1; }
key=$( { node --version; cat "$here/package.json" "$here/package-lock.json"; } | sha256sum | cut -c1-16)

if [[ -n ${PLEXUS_TS_ENV_DIR:-} ]]; then
    base=$PLEXUS_TS_ENV_DIR
elif mkdir -p /var/cache/plexus-tests 2>/dev/null && [[ -w /var/cache/plexus-tests ]]; then
    base=/var/cache/plexus-tests
else
    base=${CARGO_TARGET_DIR:-$root/target}
fi
env=$base/typescript-sdk-$key

if [[ -f $env/.complete ]]; then
    echo "$env"
    exit 0
fi

log "making $env"
# The marker file says the install was completed (an interrupted one is made again).
rm -rf "$env"
mkdir -p "$env"
cp "$here/package.json" "$here/package-lock.json" "$env/"
(cd "$env" && timeout 600 npm ci --no-audit --no-fund --loglevel=error >&2)
"$env/node_modules/.bin/jco" --version >&2
touch "$env/.complete"
echo "$env"
