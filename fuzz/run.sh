#!/usr/bin/env bash
# fuzz/run.sh: builds poimen's fuzz targets on stable Rust (no cargo-fuzz, no
# nightly) and runs them with libFuzzer.
#
#   fuzz/run.sh build                      build every target
#   fuzz/run.sh smoke [SECONDS]            every target for SECONDS (default 20)
#                                          over a scratch copy of its corpus;
#                                          fails on the first crash
#   fuzz/run.sh long TARGET RUNS [ARGS..]  TARGET for RUNS executions, new
#                                          inputs kept in fuzz/work/TARGET
#   fuzz/run.sh minimize TARGET            merge fuzz/work/TARGET and the
#                                          committed corpus into a fresh
#                                          minimal corpus (every edge either
#                                          reaches), replacing it
#   fuzz/run.sh repro TARGET FILE...       run inputs once (a crash's artifact)
#
# The committed corpora (fuzz/corpus/TARGET) are only read by `smoke` and
# `long`; only `minimize` rewrites one. Crashes are written to
# fuzz/artifacts/TARGET/. Everything it needs missing is an error, never a
# skip.
set -euo pipefail

FUZZ_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TARGETS=(frontend_yaml frontend_json canonical validate cel_predicates refold policy)

die() {
  echo "fuzz/run.sh: $*" >&2
  exit 1
}

for tool in cargo rustc c++; do
  command -v "$tool" >/dev/null 2>&1 || die "\`$tool\` is not installed (needed to build the fuzz targets)"
done

HOST="$(rustc -vV | sed -n 's/^host: //p')"
[[ -n "$HOST" ]] || die "cannot tell the host target from \`rustc -vV\`"
BIN_DIR="$FUZZ_DIR/target/$HOST/release"

# cargo-fuzz's instrumentation, minus what needs nightly (-Zsanitizer=address:
# the crates under test forbid unsafe code). Passed with an explicit --target
# so build scripts and proc macros are built without it.
RUSTFLAGS_FUZZ="-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
--cfg fuzzing -Cdebug-assertions -Coverflow-checks"

# Per-input limits: a slow input (10 s) or a large allocation (2 GiB) is a
# finding like a panic.
LIMITS=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048)

build() {
  echo "fuzz/run.sh: building ${TARGETS[*]} for $HOST" >&2
  local t bins=()
  for t in "${TARGETS[@]}"; do bins+=(--bin "$t"); done
  RUSTFLAGS="$RUSTFLAGS_FUZZ" CARGO_INCREMENTAL=0 \
    cargo build --release --manifest-path "$FUZZ_DIR/Cargo.toml" \
    --target "$HOST" --target-dir "$FUZZ_DIR/target" "${bins[@]}"
  for t in "${TARGETS[@]}"; do
    [[ -x "$BIN_DIR/$t" ]] || die "the build did not produce $BIN_DIR/$t"
    [[ -f "$FUZZ_DIR/dict/$(dict_of "$t").dict" ]] || die "no dictionary for $t at fuzz/dict/$(dict_of "$t").dict"
  done
}

check_target() {
  local t="$1" known
  for known in "${TARGETS[@]}"; do [[ "$t" == "$known" ]] && return 0; done
  die "unknown target \`$t\`; targets: ${TARGETS[*]}"
}

corpus_of() {
  local dir="$FUZZ_DIR/corpus/$1"
  [[ -d "$dir" ]] || die "no corpus at $dir"
  [[ -n "$(ls -A "$dir")" ]] || die "the corpus at $dir is empty"
  echo "$dir"
}

# The four targets that read workflow documents share one dictionary; the
# mapping lives here rather than in symlinks, which do not survive every copy.
dict_of() {
  case "$1" in
    frontend_yaml | frontend_json | canonical | validate) echo workflow ;;
    *) echo "$1" ;;
  esac
}

dict_args() {
  echo "-dict=$FUZZ_DIR/dict/$(dict_of "$1").dict"
}

artifacts_of() {
  mkdir -p "$FUZZ_DIR/artifacts/$1"
  echo "-artifact_prefix=$FUZZ_DIR/artifacts/$1/"
}

smoke() {
  local secs="${1:-20}" t scratch corpus start end log
  [[ "$secs" =~ ^[0-9]+$ ]] && (( secs > 0 && secs <= 60 )) || die "smoke seconds must be 1..60, got \`$secs\`"
  build
  start=$(date +%s)
  for t in "${TARGETS[@]}"; do
    corpus="$(corpus_of "$t")"
    scratch="$(mktemp -d)"
    cp -R "$corpus/." "$scratch/"
    log="$scratch.log"
    echo "fuzz/run.sh: smoke $t for ${secs}s over $(ls "$corpus" | wc -l) corpus inputs" >&2
    # shellcheck disable=SC2046
    if ! "$BIN_DIR/$t" -max_total_time="$secs" -print_final_stats=1 "${LIMITS[@]}" \
      $(dict_args "$t") "$(artifacts_of "$t")" "$scratch" >"$log" 2>&1; then
      tail -n 60 "$log" >&2
      rm -rf "$scratch" "$log"
      die "smoke: target $t FAILED (crash, timeout or OOM); the input is in fuzz/artifacts/$t/"
    fi
    grep -E '^(#[0-9]+ +DONE|Done [0-9]+ runs)' "$log" >&2 || true
    grep -E '^stat::number_of_executed_units' "$log" >&2 || die "smoke: $t printed no statistics"
    rm -rf "$scratch" "$log"
  done
  end=$(date +%s)
  echo "fuzz/run.sh: smoke passed: ${#TARGETS[@]} targets, $((end - start))s of fuzzing" >&2
}

long() {
  local t="$1" runs="$2"
  shift 2
  check_target "$t"
  [[ "$runs" =~ ^[0-9]+$ ]] || die "RUNS must be a number, got \`$runs\`"
  local corpus work="$FUZZ_DIR/work/$t"
  corpus="$(corpus_of "$t")"
  build
  mkdir -p "$work"
  # shellcheck disable=SC2046
  "$BIN_DIR/$t" -runs="$runs" -print_final_stats=1 "${LIMITS[@]}" \
    $(dict_args "$t") "$(artifacts_of "$t")" "$@" "$work" "$corpus"
}

minimize() {
  local t="$1"
  check_target "$t"
  local corpus fresh
  corpus="$(corpus_of "$t")"
  build
  fresh="$(mktemp -d)"
  local sources=("$corpus")
  [[ -d "$FUZZ_DIR/work/$t" ]] && sources+=("$FUZZ_DIR/work/$t")
  # Edge coverage only, by set cover: the fewest inputs that reach every
  # edge any of them reaches (counting hit counts would keep thousands).
  "$BIN_DIR/$t" -merge=1 -set_cover_merge=1 -use_counters=0 "${LIMITS[@]}" \
    "$(artifacts_of "$t")" "$fresh" "${sources[@]}"
  [[ -n "$(ls -A "$fresh")" ]] || die "merge produced an empty corpus"
  # Inputs that once broke the target keep their names (libFuzzer names
  # what it adds by hash): they stay whether or not they add coverage.
  local f
  for f in "$corpus"/*; do
    [[ "$(basename "$f")" =~ ^[0-9a-f]{40}$ ]] || cp "$f" "$fresh/"
  done
  rm -rf "$corpus"
  mv "$fresh" "$corpus"
  chmod 755 "$corpus"
  echo "fuzz/run.sh: $t corpus: $(ls "$corpus" | wc -l) files, $(du -sb "$corpus" | cut -f1) bytes" >&2
}

repro() {
  local t="$1"
  shift
  check_target "$t"
  (( $# > 0 )) || die "repro needs at least one input file"
  build
  "$BIN_DIR/$t" "${LIMITS[@]}" "$@"
}

cmd="${1:-}"
shift || true
case "$cmd" in
  build) build ;;
  smoke) smoke "$@" ;;
  long) (( $# >= 2 )) || die "usage: fuzz/run.sh long TARGET RUNS [libFuzzer args]"; long "$@" ;;
  minimize) (( $# == 1 )) || die "usage: fuzz/run.sh minimize TARGET"; minimize "$1" ;;
  repro) (( $# >= 2 )) || die "usage: fuzz/run.sh repro TARGET FILE..."; repro "$@" ;;
  *) die "usage: fuzz/run.sh build | smoke [SECONDS] | long TARGET RUNS [ARGS..] | minimize TARGET | repro TARGET FILE..." ;;
esac
