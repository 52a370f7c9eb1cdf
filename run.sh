#!/usr/bin/env bash
# Builds the release binaries and runs the harness; arguments pass through
# (case ids such as L3, --list, --keep-cluster, --seed N; see `./run.sh --help`).
# `./run.sh bench [--duration-s N]` runs the benchmark instead (see `./run.sh bench --help`).
# `./run.sh explore [--seed N] [--duration-s S] [--clients C]` runs the exploration
# (random workloads, a nemesis, a history checker; see `./run.sh explore --help`).
# `./run.sh matrix [ids]` runs the cases once per PostgreSQL major (15-18) and writes
# evidence/matrix.md and matrix.json; `--pg N` picks one major, `--database-url URL` an
# existing server.
set -euo pipefail
cd "$(dirname "$0")"
echo "run.sh: building release binaries" >&2
cargo build --release --quiet --bins
if [ "${1:-}" = "bench" ]; then
    shift
    exec target/release/bench --out evidence/bench "$@"
fi
if [ "${1:-}" = "explore" ]; then
    shift
    exec target/release/explore --evidence-dir evidence "$@"
fi
if [ "${1:-}" = "matrix" ]; then
    shift
    exec target/release/harness --evidence-dir evidence --matrix "$@"
fi
exec target/release/harness --evidence-dir evidence "$@"
