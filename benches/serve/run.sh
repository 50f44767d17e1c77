#!/usr/bin/env bash
# One client, one run after another, against `poimen serve --http` on the
# embedded SQLite store (issue 44, Must 1 and 2): per run the latency (p50,
# p99), the server's CPU (utime + stime of its process ÷ runs) and — in a
# second pass under `strace -f -c` — its fdatasync, pwrite64 and other
# calls. Each binary given is measured in turn, in the same run, so a
# baseline and a change sit side by side. Not part of CI.
#
#   benches/serve/run.sh [--bin PATH]... [--workflow effect-free|effect-middle]
#                        [--mode wait|events] [--duration S] [--warmup S]
#                        [--no-strace] [--perf]
#
#   --bin PATH    a poimen binary (default target/release/poimen); repeat to
#                 compare (the first is the baseline of the ratios)
#   --workflow    effect-free: benches/peers/poimen/three-steps.yaml (three
#                 `json` steps); effect-middle: the same with its middle step
#                 an idempotent tool that writes a file (ledger-idempotent)
#   --mode        wait: one request per run, `POST /v1/runs?wait=30` answers
#                 with the run's outcome (a binary that does not know `wait`
#                 answers at once and the client reads the events instead);
#                 events: `POST /v1/runs`, then `GET /v1/runs/ID/events` to
#                 the run's end
#   --perf        also `perf record -g` the server over the measured window
#                 (target/serve-bench/NAME.perf.data)
#
# Needs: cargo (builds the load client of benches/peers), curl, strace
# (Debian package `strace`) unless --no-strace, perf with --perf.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$ROOT/target/serve-bench
PORT=18191
BINS=()
WORKFLOW=effect-free
MODE=wait
DURATION=15
WARMUP=3
STRACE=1
PERF=0

die() { echo "serve/run.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) BINS+=("$2"); shift 2 ;;
        --workflow) WORKFLOW=$2; shift 2 ;;
        --mode) MODE=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --warmup) WARMUP=$2; shift 2 ;;
        --no-strace) STRACE=0; shift ;;
        --perf) PERF=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument \`$1\` (see --help)" ;;
    esac
done
[ ${#BINS[@]} -gt 0 ] || BINS=("$ROOT/target/release/poimen")
case "$WORKFLOW" in effect-free|effect-middle) ;; *) die "unknown workflow $WORKFLOW" ;; esac
case "$MODE" in wait|events) ;; *) die "unknown mode $MODE" ;; esac
command -v curl >/dev/null || die "missing curl"
[ $STRACE = 0 ] || command -v strace >/dev/null || die "missing strace (apt-get install strace), or pass --no-strace"
[ $PERF = 0 ] || command -v perf >/dev/null || die "missing perf (apt-get install linux-perf)"
for b in "${BINS[@]}"; do [ -x "$b" ] || die "no binary at $b"; done

mkdir -p "$OUT"
LOAD_TARGET=$ROOT/target/peers/load-target
cargo build --release --quiet --manifest-path "$ROOT/benches/peers/load/Cargo.toml" --target-dir "$LOAD_TARGET"
LOAD=$LOAD_TARGET/release/peers-load

WF=$OUT/workflow.yaml
POLICY=$OUT/policy.toml
cp "$ROOT/benches/peers/poimen/three-steps.yaml" "$WF"
: > "$POLICY"
if [ "$WORKFLOW" = effect-middle ]; then
    python3 - "$WF" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
s = s.replace('''  - id: step2
    tool: {name: "json@^0.1", args: {value: {n: "{{ steps.step1.output.n + 1 }}"}, select: ""}}''',
'''  - id: step2
    tool: {name: "ledger-idempotent@^0.1", args: {entry: {n: "{{ steps.step1.output.n }}"}}}
  - id: step2b
    tool: {name: "json@^0.1", args: {value: {n: "{{ steps.step1.output.n + 1 }}"}, select: ""}}''')
s = s.replace("  - {from: step2, to: step3}", "  - {from: step2, to: step2b}\n  - {from: step2b, to: step3}")
s = s.replace("steps.step2.output.n", "steps.step2b.output.n")
open(p, "w").write(s)
EOF
    cat > "$POLICY" <<EOF
[plugins.ledger-idempotent]
fs-write = { "/ledger" = "$OUT/ledger" }
EOF
fi

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
CLK_TCK=$(getconf CLK_TCK)

SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT

start_server() { # BIN DIR
    rm -rf "$2" "$OUT/ledger"; mkdir -p "$2" "$OUT/ledger"
    ("$1" --policy "$POLICY" --store "$2/store.db" publish "$WF" >"$2/publish.log" 2>&1 \
        && "$1" --policy "$POLICY" --store "$2/store.db" arm "bench.peers@latest" >>"$2/publish.log" 2>&1) \
        || die "publishing or arming the workflow failed: $(cat "$2/publish.log")"
    (cd "$2" && exec "$1" --policy "$POLICY" --store "$2/store.db" serve --http "127.0.0.1:$PORT" \
        >"$2/serve.log" 2>&1) &
    SERVER=$!
    for _ in $(seq 1 200); do
        curl -sf "http://127.0.0.1:$PORT/v1/health" >/dev/null && break
        sleep 0.05
    done
    curl -sf "http://127.0.0.1:$PORT/v1/health" >/dev/null || die "the server did not start: $(cat "$2/serve.log")"
}

stop_server() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=; }

load() { # LABEL EXTRA-ARGS...
    local label=$1; shift
    local url="http://127.0.0.1:$PORT/v1/runs"
    local args=(--body '{"workflow": "bench.peers", "input": {"n": 1}}' --concurrency 1 --label "$label")
    if [ "$MODE" = wait ]; then url="$url?wait=30"; else args+=(--events); fi
    "$LOAD" --url "$url" "${args[@]}" "$@"
}

# A binary that does not know `?wait=` answers 201 `running` at once: for
# it, the client follows the events.
answers_wait() { # DIR
    local body
    body=$(curl -s -X POST -H 'content-type: application/json' \
        -d '{"workflow": "bench.peers", "input": {"n": 1}}' "http://127.0.0.1:$PORT/v1/runs?wait=30")
    grep -q '"status":"completed"' <<<"$body"
}

printf '%-28s %9s %9s %11s %9s %9s %9s %9s %9s\n' binary "p50 ms" "p99 ms" "cpu ms/run" fdatasync pwrite64 pread64 fcntl futex > "$OUT/table.txt"
base_cpu=
for bin in "${BINS[@]}"; do
    name=$(printf '%s' "$bin" | tr -c 'A-Za-z0-9._-' '_' | sed 's/^_*//')
    dir=$OUT/$name
    start_server "$bin" "$dir"
    extra=()
    if [ "$MODE" = wait ] && ! answers_wait "$dir"; then
        echo "serve/run.sh: $bin does not answer ?wait=; following the events" >&2
        extra=(--events)
    fi
    # Pass 1: latency and CPU.
    c0=$(cpu_ticks "$SERVER")
    if [ $PERF = 1 ]; then
        perf record -g -o "$dir.perf.data" -p "$SERVER" 2>/dev/null &
        perf_pid=$!
    fi
    line=$(load "$name" --warmup 0 --duration "$((WARMUP + DURATION))" "${extra[@]}")
    [ $PERF = 1 ] && { kill -INT "$perf_pid"; wait "$perf_pid" || true; }
    c1=$(cpu_ticks "$SERVER")
    echo "$line" >&2
    runs=$(sed -n 's/.*total_ok=\([0-9]*\).*/\1/p' <<<"$line")
    p50=$(sed -n 's/.* p50_ms=\([0-9.]*\).*/\1/p' <<<"$line")
    p99=$(sed -n 's/.* p99_ms=\([0-9.]*\).*/\1/p' <<<"$line")
    cpu=$(python3 -c "print(f'{($c1 - $c0) * 1000 / $CLK_TCK / $runs:.3f}')")
    # Pass 2: system calls per run.
    counts=(- - - - -)
    if [ $STRACE = 1 ]; then
        strace -f -c -o "$dir/strace.txt" -p "$SERVER" 2>/dev/null &
        st=$!
        sleep 1
        sline=$(load "$name/strace" --warmup 0 --duration "$DURATION" "${extra[@]}")
        sleep 0.5
        kill -INT "$st"; wait "$st" || true
        sruns=$(sed -n 's/.*total_ok=\([0-9]*\).*/\1/p' <<<"$sline")
        i=0
        for call in fdatasync pwrite64 pread64 fcntl futex; do
            n=$(awk -v c="$call" '$NF == c { print $4 }' "$dir/strace.txt")
            counts[$i]=$(python3 -c "print(f'{${n:-0} / $sruns:.2f}')")
            i=$((i + 1))
        done
    fi
    stop_server
    printf '%-28s %9s %9s %11s %9s %9s %9s %9s %9s\n' "$name" "$p50" "$p99" "$cpu" "${counts[@]}" >> "$OUT/table.txt"
done
echo
echo "workflow $WORKFLOW, mode $MODE, one client, ${DURATION}s measured (+${WARMUP}s), $(nproc) cores"
cat "$OUT/table.txt"
