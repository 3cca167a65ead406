#!/usr/bin/env bash
# The one device script: install, build the CUDA extension once, run the GPU tests under
# compute-sanitizer (memcheck and racecheck, on a representative subset) and in full without it,
# then the SpMM benchmark. A short table comes last; logs, CSV and chart go under $OUT.
#
#   scripts/gpu_check.sh [STAGES]     STAGES: comma list of build,test,memcheck,racecheck,bench
#                                     (default all). BENCH_ARGS passes options to benchmarks/spmm.py.
#
# Real graphs travel git-ignored: copy ../shared/data/graphs to .devdata/graphs and carry .devdata.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TCSPARSE_GRAPHS=${TCSPARSE_GRAPHS:-.devdata/graphs}
export TCSPARSE_BUILD_DIR=${TCSPARSE_BUILD_DIR:-$PWD/.devdata/build}
PY=${PYTHON:-python3}
STAGES=",${1:-build,test,memcheck,racecheck,bench},"
declare -a summary
# racecheck watches every shared-memory access and is the slowest: a narrower subset.
declare -A SANITIZER_FILTER=([memcheck]="" [racecheck]="shape_grid or hub_row or repeated")

stage() { [[ "$STAGES" == *",$1,"* ]]; }
record() { summary+=("$(printf '%-10s %s' "$1" "$2")"); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
git log -1 --format='commit %h %cs' 2>/dev/null || true

$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }

start=$SECONDS
if ! $PY -m torch_tcsparse._ext >"$OUT/build.log" 2>&1; then
  tail -60 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
record build "ok ($((SECONDS - start)) s)"

if stage test; then
  start=$SECONDS
  $PY -m pytest -q -p no:cacheprovider tests/gpu >"$OUT/test.log" 2>&1
  record test "rc=$? ($((SECONDS - start)) s): $(tail -1 "$OUT/test.log")"
fi

for tool in memcheck racecheck; do
  if stage $tool; then
    start=$SECONDS
    TCSPARSE_SANITIZER_SUBSET=1 compute-sanitizer --tool $tool --error-exitcode 99 \
      $PY -m pytest -q -p no:cacheprovider tests/gpu -k "${SANITIZER_FILTER[$tool]:-not nothing_excluded}" >"$OUT/$tool.log" 2>&1
    rc=$?
    record $tool "rc=$rc ($((SECONDS - start)) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/$tool.log" | tail -2 | tr '\n' ' ')"
  fi
done

if stage bench; then
  $PY benchmarks/spmm.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -E "^  |WRONG" || true
fi

echo
printf '%s\n' "${summary[@]}"
grep -q "FAILED\|Error" "$OUT/test.log" 2>/dev/null && grep -E "^(FAILED|ERROR)" "$OUT/test.log" | head -20
if stage bench; then sed -n '/^SpMM ms/,$p' "$OUT/bench.log"; fi
