#!/usr/bin/env bash
# Makes (once) the Python environment that builds and tests Python hooks, and prints its directory: a venv with
# the pinned toolchain of requirements.lock, installed with --require-hashes. One venv per content of the lock and
# per Python version, so a changed pin gets a new venv and an unchanged one is only checked.
#
# Where: $PLEXUS_PY_VENV_DIR if set; else under /var/cache/plexus-tests (the suite's cache, as tests/parts.sh) when
# it is writable; else under the repository's target directory. Needs python3 (3.10 or later) with its venv module.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
lock=$here/requirements.lock
log() { echo "python-sdk: $*" >&2; }

py=${PYTHON:-python3}
command -v "$py" >/dev/null || { log "no $py on PATH"; exit 1; }
"$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || { log "$py is older than 3.10"; exit 1; }
key=$( { "$py" -c 'import sys; print(sys.version)'; cat "$lock"; } | sha256sum | cut -c1-16)

if [[ -n ${PLEXUS_PY_VENV_DIR:-} ]]; then
    base=$PLEXUS_PY_VENV_DIR
elif mkdir -p /var/cache/plexus-tests 2>/dev/null && [[ -w /var/cache/plexus-tests ]]; then
    base=/var/cache/plexus-tests
else
    base=${CARGO_TARGET_DIR:-$root/target}
fi
venv=$base/python-sdk-$key

if [[ -x $venv/bin/componentize-py && -f $venv/.complete ]]; then
    echo "$venv"
    exit 0
fi

log "making $venv"
# A venv's scripts name their interpreter by absolute path, so it is made where it stays; the marker file says it
# was completed (an interrupted one is made again).
rm -rf "$venv"
mkdir -p "$base"
"$py" -m venv "$venv"
timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --require-hashes --only-binary=:all: -r "$lock"
"$venv/bin/componentize-py" --version >&2
touch "$venv/.complete"
echo "$venv"
