#!/usr/bin/env bash
# Against peers (issue 16, target 7): the same durable 3-step workflow (each
# step a trivial pure function) on poimen, DBOS and Restate, driven by one
# HTTP load client (benches/peers/load), 16 concurrent clients in a closed
# loop and then 1 (sequential). Installs its peers under target/peers/,
# builds poimen's service in release, starts each system in turn, warms it
# up, measures it, stops it, and prints one table. Not part of CI.
#
#   benches/peers/run.sh [--systems "poimen poimen-serve-sqlite poimen-serve-pg dbos restate"]
#                        [--duration S] [--warmup S] [--seq-duration S]
#                        [--concurrency N] [--no-ceiling] [--no-build] [--fresh-too]
#
#   --no-build   use target/release/{examples/embed,poimen} as they are (fails
#                if absent) instead of running cargo build first
#   --fresh-too  measure each system a second time with a new TCP connection
#                per request (row `NAME/fresh`): shows what a server's
#                small-write stalls (Nagle + delayed ACK) cost on keep-alive
#
# Systems:
#   poimen              examples/embed (SQLite store): POST /v1/runs starts
#                       the run and answers 201 (`running`); the client then
#                       reads GET /v1/runs/ID/events until the run's end
#   poimen-serve-sqlite `poimen serve --http` on SQLite: POST /v1/runs
#                       queues the run for the serving loop; the client then
#                       reads the events the same way
#   poimen-serve-pg     the same on PostgreSQL (a scratch database)
#   dbos                DBOS (PyPI `dbos`) in a FastAPI app under uvicorn,
#                       system database on PostgreSQL (a scratch database)
#   restate             restate-server (single node, its defaults) and a
#                       Node service with 3 `ctx.run` steps, called through
#                       the ingress
#
# Needs: cargo, python3 (with venv), node and npm, the PostgreSQL client
# tools (psql, createdb, dropdb) and a PostgreSQL server at $PGHOST:$PGPORT
# (default 127.0.0.1:5432, user postgres) that lets it create databases.
# Fails (non-zero, naming what is missing or what broke) rather than skip.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/benches/peers
PEERS=$ROOT/target/peers
RUN=$PEERS/run

SYSTEMS="poimen poimen-serve-sqlite poimen-serve-pg dbos restate"
DURATION=20
WARMUP=5
SEQ_DURATION=10
CONCURRENCY=16
CEILING=1
BUILD_POIMEN=1
FRESH=0

# Pinned peers.
DBOS_VERSION=3.4.0
PY_PINS=(
    "dbos==$DBOS_VERSION" "psycopg[binary]==3.3.9" "fastapi==0.165.0" "uvicorn==0.55.0"
)
RESTATE_VERSION=1.7.12
RESTATE_SDK_VERSION=1.17.2

export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}

# Ports (none of the machine's usual services; Restate off its defaults).
P_POIMEN=18181
P_DBOS=18282
P_TRIVIAL=18999
P_RESTATE_INGRESS=18080
P_RESTATE_ADMIN=19070
P_RESTATE_NODE=15122
P_RESTATE_SERVICE=19080

die() {
    echo "run.sh: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
        --systems) SYSTEMS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --warmup) WARMUP=$2; shift 2 ;;
        --seq-duration) SEQ_DURATION=$2; shift 2 ;;
        --concurrency) CONCURRENCY=$2; shift 2 ;;
        --no-ceiling) CEILING=0; shift ;;
        --no-build) BUILD_POIMEN=0; shift ;;
        --fresh-too) FRESH=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument \`$1\` (see --help)" ;;
    esac
done
for s in $SYSTEMS; do
    case "$s" in
        poimen|poimen-serve-sqlite|poimen-serve-pg|dbos|restate) ;;
        *) die "unknown system \`$s\`" ;;
    esac
done
has() { case " $SYSTEMS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
needs_pg() { has poimen-serve-pg || has dbos; }

# ---------------------------------------------------------------- checks
need() { command -v "$1" >/dev/null 2>&1 || die "missing \`$1\` ($2)"; }
need cargo "the Rust toolchain builds poimen and the load client"
need curl "used to wait for the services"
if has dbos; then need python3 "DBOS runs in a Python venv"; fi
if has restate; then need node "the Restate service runs on Node"; need npm "installs Restate"; fi
if needs_pg; then
    need psql "PostgreSQL client"; need createdb "PostgreSQL client"; need dropdb "PostgreSQL client"
    psql -d postgres -tAc 'select 1' >/dev/null 2>&1 \
        || die "PostgreSQL not reachable as $PGUSER@$PGHOST:$PGPORT (database postgres)"
fi
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in $P_POIMEN $P_DBOS $P_TRIVIAL $P_RESTATE_INGRESS $P_RESTATE_ADMIN $P_RESTATE_NODE $P_RESTATE_SERVICE; do
    port_free "$p" || die "port $p on 127.0.0.1 is in use"
done

mkdir -p "$PEERS" "$RUN"
LOGS=$RUN/logs
rm -rf "$LOGS"; mkdir -p "$LOGS"

# ------------------------------------------------------- cleanup on exit
PIDS=()
DBS=()
stop_pid() {
    local pid=$1
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}
cleanup() {
    local pid db
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    PIDS=()
    for db in "${DBS[@]}"; do dropdb --if-exists --force "$db" 2>/dev/null || echo "run.sh: could not drop database $db" >&2; done
    DBS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

scratch_db() { # NAME ; sets DB
    DB="peers_$1_$$"
    createdb "$DB" || die "cannot create database $DB"
    DBS+=("$DB")
}

# ------------------------------------------------------------- installs
BUILD=()
if has poimen; then BUILD+=(--example embed); fi
if has poimen-serve-sqlite || has poimen-serve-pg; then BUILD+=(--bin poimen); fi
if [ ${#BUILD[@]} -gt 0 ] && [ "$BUILD_POIMEN" = 1 ]; then
    echo "== building poimen in release: cargo build --release ${BUILD[*]}" >&2
    (cd "$ROOT" && cargo build --release "${BUILD[@]}") \
        || die "cargo build --release ${BUILD[*]} failed"
fi
# Copies, so that a build in the same target dir during the run changes nothing.
mkdir -p "$PEERS/bin"
EMBED=$PEERS/bin/embed
POIMEN=$PEERS/bin/poimen
if has poimen; then
    [ -x "$ROOT/target/release/examples/embed" ] || die "no target/release/examples/embed (cargo build --release --example embed)"
    cp "$ROOT/target/release/examples/embed" "$EMBED"
fi
if has poimen-serve-sqlite || has poimen-serve-pg; then
    [ -x "$ROOT/target/release/poimen" ] || die "no target/release/poimen (cargo build --release --bin poimen)"
    cp "$ROOT/target/release/poimen" "$POIMEN"
fi
echo "== building the load client (target/peers/load-target)" >&2
(cd "$HERE/load" && CARGO_TARGET_DIR=$PEERS/load-target cargo build --release) \
    || die "building the load client failed"
LOAD=$PEERS/load-target/release/peers-load

if has dbos; then
    echo "== installing DBOS $DBOS_VERSION into target/peers/venv" >&2
    [ -x "$PEERS/venv/bin/python" ] || python3 -m venv "$PEERS/venv" || die "python3 -m venv failed (apt-get install python3-venv?)"
    "$PEERS/venv/bin/pip" install -q "${PY_PINS[@]}" || die "pip install ${PY_PINS[*]} failed"
fi
if has restate; then
    echo "== installing restate-server $RESTATE_VERSION and restate-sdk $RESTATE_SDK_VERSION into target/peers/node" >&2
    mkdir -p "$PEERS/node"
    [ -f "$PEERS/node/package.json" ] || echo '{"name":"poimen-peers","private":true,"version":"0.0.0"}' >"$PEERS/node/package.json"
    (cd "$PEERS/node" && npm install --no-audit --no-fund --silent \
        "@restatedev/restate-server@$RESTATE_VERSION" "@restatedev/restate-sdk@$RESTATE_SDK_VERSION") \
        || die "npm install of Restate failed"
    RESTATE_BIN=$PEERS/node/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server
    [ -x "$RESTATE_BIN" ] || die "no restate-server binary at $RESTATE_BIN (only linux-x64 is wired here)"
    cp "$HERE/restate/service.mjs" "$PEERS/node/service.mjs"
fi

# ----------------------------------------------------------- measuring
# utime+stime (clock ticks) of the given processes and, with `pg`, of every
# PostgreSQL server process.
cpu_ticks() {
    local total=0 pid f
    local pids=("$@")
    if [ "${pids[0]:-}" = pg ]; then
        pids=("${pids[@]:1}" $(pgrep -u postgres || true))
    fi
    for pid in "${pids[@]}"; do
        f=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
        f=${f##*) }
        set -- $f
        total=$((total + ${12} + ${13}))
    done
    echo "$total"
}
TICK=$(getconf CLK_TCK)

wait_http() { # URL what
    for _ in $(seq 1 300); do
        curl -s -o /dev/null -m 2 "$1" && return 0
        sleep 0.2
    done
    die "$2 did not answer at $1 (logs: $LOGS)"
}

wait_port() { # PORT what
    for _ in $(seq 1 300); do
        port_free "$1" || return 0
        sleep 0.2
    done
    die "$2 did not listen on port $1 (logs: $LOGS)"
}

# Everything the systems write stays under target/peers/run.
cd "$RUN"
export POIMEN_HOME=$RUN/poimen-home

RESULTS=$RUN/results.txt
: >"$RESULTS"
kv() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# measure LABEL URL BODY [--events] -- CPU_PIDS...
measure() {
    local label=$1 url=$2 body=$3
    shift 3
    local extra=()
    if [ "${1:-}" = --events ]; then extra=(--events); shift; fi
    [ "${1:-}" = -- ] && shift
    measure_one "$label" "$url" "$body" "${extra[@]}" -- "$@"
    if [ "$FRESH" = 1 ]; then
        measure_one "$label/fresh" "$url" "$body" "${extra[@]}" --fresh-connections -- "$@"
    fi
}

# measure_one LABEL URL BODY [CLIENT FLAGS...] -- CPU_PIDS...
measure_one() {
    local label=$1 url=$2 body=$3
    shift 3
    local extra=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do extra+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift
    local cpu_pids=("$@")
    local out c0 c1 ok ms seq
    echo "== $label: $CONCURRENCY concurrent, ${WARMUP}s warm-up + ${DURATION}s ($(uptime | sed 's/.*load/load/'))" >&2
    c0=$(cpu_ticks "${cpu_pids[@]}")
    out=$("$LOAD" --label "$label" --url "$url" --body "$body" "${extra[@]}" \
        --concurrency "$CONCURRENCY" --warmup "$WARMUP" --duration "$DURATION") \
        || { echo "$out" >&2; die "$label: the load client saw errors (above)"; }
    c1=$(cpu_ticks "${cpu_pids[@]}")
    ok=$(kv "$out" total_ok)
    ms=$(awk -v d=$((c1 - c0)) -v n="$ok" -v t="$TICK" 'BEGIN { printf "%.2f", (n > 0 ? d * 1000 / t / n : 0) }')
    echo "$out" >&2
    echo "== $label: sequential, 2s warm-up + ${SEQ_DURATION}s" >&2
    seq=$("$LOAD" --label "$label" --url "$url" --body "$body" "${extra[@]}" \
        --concurrency 1 --warmup 2 --duration "$SEQ_DURATION") \
        || { echo "$seq" >&2; die "$label: the load client saw errors in the sequential run (above)"; }
    echo "$seq" >&2
    echo "$label $(kv "$out" runs_per_s) $(kv "$out" p50_ms) $(kv "$out" p90_ms) $(kv "$out" p99_ms) $(kv "$seq" p50_ms) $(kv "$seq" p99_ms) $(kv "$seq" runs_per_s) $ms $(kv "$out" errors)" >>"$RESULTS"
}

start_bg() { # LOGNAME CMD... ; sets STARTED_PID
    local log=$1
    shift
    "$@" >"$LOGS/$log.log" 2>&1 &
    STARTED_PID=$!
    PIDS+=("$STARTED_PID")
}

# ------------------------------------------------- the client's ceiling
if [ "$CEILING" = 1 ]; then
    start_bg trivial "$LOAD" serve-trivial --listen "127.0.0.1:$P_TRIVIAL"
    wait_http "http://127.0.0.1:$P_TRIVIAL/" "the trivial endpoint"
    measure client-ceiling "http://127.0.0.1:$P_TRIVIAL/" '{}' -- "$STARTED_PID"
    cleanup
fi

WF=$HERE/poimen/three-steps.yaml
POIMEN_BODY='{"workflow": "bench.peers", "input": {"n": 1}}'

# ------------------------------------------------------------- poimen
if has poimen; then
    rm -rf "$RUN/poimen-embed"; mkdir -p "$RUN/poimen-embed"
    start_bg poimen-embed "$EMBED" --listen "127.0.0.1:$P_POIMEN" \
        --store "$RUN/poimen-embed/poimen.db" --publish "$WF"
    wait_http "http://127.0.0.1:$P_POIMEN/service" "poimen (examples/embed)"
    measure poimen "http://127.0.0.1:$P_POIMEN/v1/runs" "$POIMEN_BODY" --events -- "$STARTED_PID"
    cleanup
fi

poimen_serve() { # LABEL STORE [pg]
    local label=$1 store=$2 pg=${3:-}
    ("$POIMEN" --store "$store" publish "$WF" >"$LOGS/$label-publish.log" 2>&1 \
        && "$POIMEN" --store "$store" arm "bench.peers@latest" >>"$LOGS/$label-publish.log" 2>&1) \
        || { cat "$LOGS/$label-publish.log" >&2; die "$label: publishing or arming the workflow failed"; }
    # --max-runs above the clients, so that no run waits for a slot.
    start_bg "$label" "$POIMEN" --store "$store" serve --http "127.0.0.1:$P_POIMEN" \
        --max-runs $((CONCURRENCY * 2))
    wait_http "http://127.0.0.1:$P_POIMEN/v1/health" "poimen serve ($label)"
    measure "$label" "http://127.0.0.1:$P_POIMEN/v1/runs" "$POIMEN_BODY" --events -- $pg "$STARTED_PID"
    cleanup
}
if has poimen-serve-sqlite; then
    rm -rf "$RUN/poimen-serve"; mkdir -p "$RUN/poimen-serve"
    poimen_serve poimen-serve-sqlite "$RUN/poimen-serve/poimen.db"
fi
if has poimen-serve-pg; then
    scratch_db poimen
    poimen_serve poimen-serve-pg "postgres://$PGUSER@$PGHOST:$PGPORT/$DB" pg
fi

# --------------------------------------------------------------- DBOS
if has dbos; then
    scratch_db dbos
    start_bg dbos env DBOS_SYSTEM_DATABASE_URL="postgresql://$PGUSER@$PGHOST:$PGPORT/$DB" \
        "$PEERS/venv/bin/python" "$HERE/dbos/app.py" --port "$P_DBOS"
    wait_http "http://127.0.0.1:$P_DBOS/health" "DBOS app"
    measure dbos "http://127.0.0.1:$P_DBOS/run" '{"n": 1}' -- pg "$STARTED_PID"
    cleanup
fi

# ------------------------------------------------------------ Restate
if has restate; then
    rm -rf "$RUN/restate-data"
    start_bg restate-server "$RESTATE_BIN" --config-file "$HERE/restate/restate.toml" \
        --base-dir "$RUN/restate-data" --no-logo --listen-mode tcp
    server_pid=$STARTED_PID
    wait_http "http://127.0.0.1:$P_RESTATE_ADMIN/health" "restate-server admin"
    start_bg restate-service env PORT=$P_RESTATE_SERVICE RESTATE_LOGGING=WARN \
        node "$PEERS/node/service.mjs"
    svc_pid=$STARTED_PID
    wait_port "$P_RESTATE_SERVICE" "the Restate service"
    curl -sf -m 30 -X POST "http://127.0.0.1:$P_RESTATE_ADMIN/deployments" \
        -H 'content-type: application/json' \
        -d "{\"uri\": \"http://127.0.0.1:$P_RESTATE_SERVICE\"}" >"$LOGS/restate-register.json" \
        || die "registering the Restate service failed (logs: $LOGS)"
    wait_http "http://127.0.0.1:$P_RESTATE_INGRESS/restate/health" "restate-server ingress"
    measure restate "http://127.0.0.1:$P_RESTATE_INGRESS/Bench/run" '{"n": 1}' -- "$server_pid" "$svc_pid"
    cleanup
fi

# --------------------------------------------------------------- table
echo
echo "Machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; $(date -u +%Y-%m-%dT%H:%MZ)"
echo "Each row: $CONCURRENCY concurrent clients (${WARMUP}s warm-up, ${DURATION}s measured), then 1 client (${SEQ_DURATION}s)."
echo
printf '| %-25s | %9s | %8s | %8s | %8s | %8s | %8s | %9s | %11s | %6s |\n' \
    system "runs/s@$CONCURRENCY" "p50 ms" "p90 ms" "p99 ms" "seq p50" "seq p99" "seq run/s" "server CPU ms/run" errors
printf '|%s|\n' "---------------------------|----------:|---------:|---------:|---------:|---------:|---------:|----------:|------------:|-------:"
while read -r label rps p50 p90 p99 sp50 sp99 srps cpu err; do
    printf '| %-25s | %9s | %8s | %8s | %8s | %8s | %8s | %9s | %11s | %6s |\n' \
        "$label" "$rps" "$p50" "$p90" "$p99" "$sp50" "$sp99" "$srps" "$cpu" "$err"
done <"$RESULTS"
