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

# Writes the table in file $2 as the kept section $1 of BENCHMARKS.md (scripts/lib/
# kept_sections.py), under a line naming the run (the commit, the CPUs, script $3 with the
# rest of the arguments) followed by the text $4; says so on stderr.
keep_section() {
    local heading=$1 table=$2 script=$3 intro=$4
    shift 4
    local commit
    commit=$(git describe --always --dirty)
    python3 scripts/lib/kept_sections.py BENCHMARKS.md "$heading" "$table" \
        "Run on $(date -u '+%Y-%m-%d %H:%M UTC') (commit \`$commit\`, $(nproc) CPUs): \`$script${*:+ $*}\`.${intro:+ $intro}"
    echo "wrote the ${heading#\#\# } section of BENCHMARKS.md" >&2
}
