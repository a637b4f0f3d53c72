#!/usr/bin/env bash
# Builds every guest in this workspace into a component at $TARGET/guests/<guest-name>.wasm, the Python examples
# in python/ at $TARGET/guests/py-<name>.wasm and the TypeScript ones in typescript/ at $TARGET/guests/ts-<name>.wasm,
# where $TARGET is $CARGO_TARGET_DIR or <repo>/target.
#
# Route, in order of preference:
#   1. rustup has wasm32-wasip2: cargo builds components directly;
#   2. rustup has wasm32-wasip1: cargo builds core modules, plexus-componentize wraps them;
#   3. otherwise Debian's rustc-web/cargo-web with -Zbuild-std for wasm32-wasip1, then plexus-componentize.
#      It needs Debian's rustc-web and cargo-web packages (with rust-web-src, for build-std) and wasi-libc
#      (the C library std links against), and lld-22 (linked below as rust-lld); tests/setup.sh installs
#      them.
# The whole workspace is built by one cargo invocation, so std (route 3) is built once.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
mkdir -p "$target"
target=$(cd "$target" && pwd)
out=$target/guests
build=$target/guests-build
mkdir -p "$out"

guests=$(sed -n '/^members = \[/,/^\]/p' "$here/Cargo.toml" | grep -o '"[a-z0-9-]*"' | tr -d '"')

installed=$(rustup target list --installed 2>/dev/null || true)
if grep -qx wasm32-wasip2 <<<"$installed"; then
    route=wasip2
elif grep -qx wasm32-wasip1 <<<"$installed"; then
    route=wasip1
else
    route=debian
fi
echo "build-guests: route $route, output $out" >&2

componentize() {
    local tool=$target/guests-tools/release/plexus-componentize
    if [[ ! -x $tool || $here/componentize/src/main.rs -nt $tool ]]; then
        # The host toolchain, never the wasm target's flags.
        (cd "$here/componentize" && env -u RUSTFLAGS -u RUSTC CARGO_TARGET_DIR="$target/guests-tools" \
            cargo build --release --quiet)
    fi
    for g in $guests; do
        "$tool" "$build/wasm32-wasip1/release/${g//-/_}.wasm" "$out/$g.wasm"
    done
}

case $route in
wasip2)
    (cd "$here" && CARGO_TARGET_DIR=$build cargo build --release --target wasm32-wasip2)
    for g in $guests; do
        cp "$build/wasm32-wasip2/release/${g//-/_}.wasm" "$out/$g.wasm.tmp"
        mv "$out/$g.wasm.tmp" "$out/$g.wasm"
    done
    ;;
wasip1)
    (cd "$here" && CARGO_TARGET_DIR=$build cargo build --release --target wasm32-wasip1)
    componentize
    ;;
debian)
    need=(/usr/bin/rustc /usr/bin/cargo /usr/lib/wasm32-wasi/libc.a)
    for f in "${need[@]}"; do
        if [[ ! -e $f ]]; then
            if [[ $(id -u) == 0 ]]; then
                "$root/tests/setup.sh"
                break
            fi
            echo "build-guests: $f is missing; run '$root/tests/setup.sh' as root (Debian wasm toolchain) first" >&2
            exit 1
        fi
    done
    # rustc looks for `rust-lld` (and passes it `-flavor wasm`); Debian ships lld as lld-22.
    if ! command -v rust-lld >/dev/null; then
        lld=$(command -v lld-22 || command -v lld || true)
        if [[ -z $lld ]]; then
            echo "build-guests: no lld found; run '$root/tests/setup.sh' as root first" >&2
            exit 1
        fi
        mkdir -p "$target/guests-tools/bin"
        ln -sf "$lld" "$target/guests-tools/bin/rust-lld"
        export PATH=$target/guests-tools/bin:$PATH
    fi
    (cd "$here" && RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 RUSTFLAGS="-L /usr/lib/wasm32-wasi" \
        CARGO_TARGET_DIR=$build /usr/bin/cargo build --release \
        -Zbuild-std=std,panic_abort --target wasm32-wasip1)
    componentize
    ;;
esac

# The Python examples (guests/python/<name>/<name_with_underscores>.py) into $out/py-<name>.wasm, with the pinned
# componentize-py (sdk/python/plexus-py); each is rebuilt only when its inputs changed. Both at once: each build is
# mostly one thread.
"$root/sdk/python/venv.sh" >/dev/null
py_guests=$(cd "$here/python" && ls -d */ | tr -d /)
pids=()
for g in $py_guests; do
    CARGO_TARGET_DIR=$target "$root/sdk/python/plexus-py" build "$here/python/$g" "${g//-/_}" "$out/py-$g.wasm" &
    pids+=($!)
done
for p in "${pids[@]}"; do
    wait "$p"
done

# The TypeScript examples (guests/typescript/<name>/<name>.ts) into $out/ts-<name>.wasm, with the pinned
# componentize-js (sdk/typescript/plexus-ts); each is rebuilt only when its inputs changed. One after the other:
# each build's pre-initialization already keeps both cores busy.
"$root/sdk/typescript/node-env.sh" >/dev/null
ts_guests=$(cd "$here/typescript" && ls -d */ | tr -d /)
for g in $ts_guests; do
    CARGO_TARGET_DIR=$target "$root/sdk/typescript/plexus-ts" build "$here/typescript/$g" "$g" "$out/ts-$g.wasm"
done

for g in $guests $(printf 'py-%s ' $py_guests) $(printf 'ts-%s ' $ts_guests); do
    echo "build-guests: $out/$g.wasm ($(stat -c %s "$out/$g.wasm") bytes)" >&2
done
