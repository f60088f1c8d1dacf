# Shared by scripts/bench-report.sh and scripts/soak.sh (sourced, not run).

# Exits 2 naming the first of the given commands that is missing; $1 names the caller.
require_tools() {
    local caller=$1
    shift
    for tool in "$@"; do
        command -v "$tool" >/dev/null || { echo "$caller: $tool is required" >&2; exit 2; }
    done
}

# Prints the floodgate binary to run: $FLOODGATE_BINARY, or a release build made here
# (behind $FLOODGATE_BUILD_WRAPPER, e.g. "flock /tmp/cargo.lock").
floodgate_binary() {
    if [[ -n "${FLOODGATE_BINARY:-}" ]]; then
        echo "$FLOODGATE_BINARY"
        return
    fi
    ${FLOODGATE_BUILD_WRAPPER:-} cargo build --release --locked --quiet >&2 || return 1
    echo target/release/floodgate
}
