#!/usr/bin/env bash
# The GPU check of a checkout, for a maintainer on a machine with an NVIDIA GPU, the CUDA toolkit
# and a CUDA build of torch: install, build the CUDA extension once, run the GPU tests under
# compute-sanitizer (memcheck, racecheck and synccheck, on representative subsets) and in full
# without it, the whole test suite on the GPU, then the benchmarks. A short table comes last; the
# logs, CSV files and charts are packed into one archive, $OUT/results.tgz (default out/).
#
#   scripts/gpu_check.sh [STAGES]   STAGES: comma list of build,test,memcheck,racecheck,synccheck,properties,suite,
#                                   bench,rows,reorder,permutation,selector,gcn,host_overhead,compiled,accuracy (default: build
#                                   through bench).
#                                   BENCH_ARGS, REORDER_ARGS, PERMUTATION_ARGS, SELECTOR_ARGS, GCN_ARGS,
#                                   HOST_OVERHEAD_ARGS, COMPILED_ARGS, ROWS_ARGS, ACCURACY_ARGS pass options;
#                                   STAGE_LIMIT caps each test or benchmark stage (seconds; the
#                                   sanitizer stages are the slowest: give them the most);
#                                   MEMCHECK_FILTER, RACECHECK_FILTER, SYNCCHECK_FILTER replace the sanitizers'
#                                   pytest -k subsets.
#                                   BASELINE: a directory holding another checkout (its torch_tcsparse and
#                                   benchmarks/): the benchmark stages then run its benchmark too, on the
#                                   same machine, with its own build, for a before/after table;
#                                   ROUNDS (default 1) alternates the two sides that many times and
#                                   prints the medians' ratios (benchmarks/compare.py).
#
# No network is needed: the real graphs are read from the git-ignored .devdata/ (or
# $TCSPARSE_DATA), laid out as TCSPARSE_DATA expects (graphs/ for the real graphs, ogb/ogbl_ddi
# for the accuracy stage). On a machine without ogb, its wheels (and their needs) placed in
# .devdata/whl and .devdata/whl-extra are installed to a side path, which makes the whole suite
# runnable; the accuracy stage (ogbl-ddi Hits@20, 10 seeds x both backends, 20 runs at once)
# needs ogb.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL_OUT=${OUT:-out}
export OUT=$(mktemp -d)
mkdir -p "$FINAL_OUT"
trap 'tar czf "$FINAL_OUT/results.tgz" -C "$OUT" . 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1
export TCSPARSE_DATA=${TCSPARSE_DATA:-$PWD/.devdata}
export TCSPARSE_GRAPHS=${TCSPARSE_GRAPHS:-$TCSPARSE_DATA/graphs}
export TCSPARSE_BUILD_DIR=${TCSPARSE_BUILD_DIR:-$PWD/.devdata/build}
PY=${PYTHON:-python3}
STAGES=",${1:-build,test,memcheck,racecheck,suite,bench},"
# No stage may take the whole run: each is cut at STAGE_LIMIT seconds (rc 124).
STAGE_LIMIT=${STAGE_LIMIT:-240}
declare -a summary
# racecheck watches every shared-memory access and is the slowest: a narrower subset, without
# the rows tests (the rows kernel uses no shared memory: its split rows meet in global atomics,
# which memcheck and synccheck watch; with them the subset takes far longer than STAGE_LIMIT).
# synccheck checks the warp barriers with partial masks: the rows kernel's split rows (the last
# piece of a row, counted by lanes of one group) and the kernels with many column tiles.
declare -A SANITIZER_FILTER=([memcheck]="${MEMCHECK_FILTER:-}"
  [racecheck]="${RACECHECK_FILTER:-(shape_grid or hub_row or repeated or cut_in_some or narrow) and not test_rows}"
  [synccheck]="${SYNCCHECK_FILTER:-hub_row or split_sums or bias_on_every_row or strided}")

stage() { [[ "$STAGES" == *",$1,"* ]]; }
record() { summary+=("$(printf '%-10s %s' "$1" "$2")"); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
git log -1 --format='commit %h %cs' 2>/dev/null || true

$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
# torch and PyG come from the environment; ogb and its needs, where absent, from the wheels in
# .devdata/, installed to a side path.
wheels=$(ls .devdata/whl/*.whl .devdata/whl-extra/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels \
    >>"$OUT/install.log" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

start=$SECONDS
if ! $PY -m torch_tcsparse >"$OUT/build.log" 2>&1; then
  tail -60 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
record build "ok ($((SECONDS - start)) s)"

if stage test; then
  start=$SECONDS
  timeout "$STAGE_LIMIT" $PY -m pytest -q -p no:cacheprovider tests/gpu >"$OUT/test.log" 2>&1
  record test "rc=$? ($((SECONDS - start)) s): $(tail -1 "$OUT/test.log")"
fi

for tool in memcheck racecheck synccheck; do
  if stage $tool; then
    start=$SECONDS
    TCSPARSE_SANITIZER_SUBSET=1 timeout "$STAGE_LIMIT" compute-sanitizer --tool $tool --error-exitcode 99 \
      $PY -m pytest -q -p no:cacheprovider tests/gpu -k "${SANITIZER_FILTER[$tool]:-not nothing_excluded}" >"$OUT/$tool.log" 2>&1
    rc=$?
    record $tool "rc=$rc ($((SECONDS - start)) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/$tool.log" | tail -2 | tr '\n' ' ')"
  fi
done

# The property suite's GPU cases under memcheck: fewer hypothesis examples than the plain run, since
# every example launches each path under the sanitizer.
if stage properties; then
  start=$SECONDS
  TCSPARSE_HYPOTHESIS_EXAMPLES=${PROPERTY_EXAMPLES:-6} timeout "$STAGE_LIMIT" compute-sanitizer --tool memcheck \
    --error-exitcode 99 $PY -m pytest -q -p no:cacheprovider tests/test_properties.py -k cuda >"$OUT/properties.log" 2>&1
  rc=$?
  record properties "rc=$rc ($((SECONDS - start)) s): $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/properties.log" | tail -2 | tr '\n' ' ')"
fi

if stage suite; then
  start=$SECONDS
  timeout "$STAGE_LIMIT" $PY -m pytest -q -p no:cacheprovider tests --ignore=tests/gpu >"$OUT/suite.log" 2>&1
  record suite "rc=$? ($((SECONDS - start)) s): $(tail -1 "$OUT/suite.log")"
fi

if [ -n "${BASELINE:-}" ]; then
  baseline() { PYTHONPATH="$BASELINE" TCSPARSE_BUILD_DIR="$PWD/.devdata/build-baseline" "$@"; }
  start=$SECONDS
  baseline $PY -m torch_tcsparse >"$OUT/build-baseline.log" 2>&1
  record baseline "build rc=$? ($((SECONDS - start)) s)"
fi

# With BASELINE, the two sides' benchmark processes alternate ROUNDS times, each going first in turn (host-bound cells move
# between processes by more than a change is allowed to cost) and benchmarks/compare.py takes the
# medians per cell.
ROUNDS=${ROUNDS:-1}
if stage bench; then
  if [ -n "${BASELINE:-}" ]; then
    start=$SECONDS
    before() { baseline timeout "$STAGE_LIMIT" $PY "$BASELINE/benchmarks/spmm.py" --out "$OUT/bench-baseline-$1" \
      ${BENCH_ARGS:-} >"$OUT/bench-baseline-$1.log" 2>&1; }
    after() { timeout "$STAGE_LIMIT" $PY -m benchmarks.spmm --out "$OUT/bench-after-$1" ${BENCH_ARGS:-} \
      >"$OUT/bench-after-$1.log" 2>&1; }
    for i in $(seq "$ROUNDS"); do
      mkdir -p "$OUT/bench-baseline-$i" "$OUT/bench-after-$i"
      if (( i % 2 )); then before $i; after $i; else after $i; before $i; fi
    done
    $PY -m benchmarks.compare spmm "$OUT"/bench-baseline-*/ --after "$OUT"/bench-after-*/ >"$OUT/bench-compare.log" 2>&1
    record bench "$ROUNDS rounds each side ($((SECONDS - start)) s)"
    cp "$OUT/bench-after-$ROUNDS.log" "$OUT/bench.log"
  else
    timeout "$STAGE_LIMIT" $PY -m benchmarks.spmm ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -E "^  |WRONG" || true
  fi
fi

# Each further benchmark writes into its own folder and leaves its table at the end of its log.
for name in rows reorder permutation selector gcn host_overhead compiled; do
  if stage $name; then
    start=$SECONDS
    args_var="${name^^}_ARGS"
    mkdir -p "$OUT/$name"
    if [ -n "${BASELINE:-}" ] && [ -f "$BASELINE/benchmarks/$name.py" ]; then
      before() { OUT="$OUT/$name-baseline-$1" baseline timeout "$STAGE_LIMIT" $PY "$BASELINE/benchmarks/$name.py" \
        ${!args_var:-} >"$OUT/$name-baseline-$1.log" 2>&1; }
      after() { OUT="$OUT/$name-after-$1" timeout "$STAGE_LIMIT" $PY -m benchmarks.$name ${!args_var:-} \
        >"$OUT/$name-after-$1.log" 2>&1; }
      for i in $(seq "$ROUNDS"); do
        mkdir -p "$OUT/$name-baseline-$i" "$OUT/$name-after-$i"
        if (( i % 2 )); then before $i; after $i; else after $i; before $i; fi
      done
      cp "$OUT/$name-after-$ROUNDS.log" "$OUT/$name.log"
      cp "$OUT/$name-baseline-$ROUNDS.log" "$OUT/$name-baseline.log"
      [ "$name" = host_overhead ] && $PY -m benchmarks.compare host "$OUT"/$name-baseline-*.log --after "$OUT"/$name-after-*.log \
        >"$OUT/$name-compare.log" 2>&1
    else
      OUT="$OUT/$name" timeout "$STAGE_LIMIT" $PY -m benchmarks.$name ${!args_var:-} >"$OUT/$name.log" 2>&1
    fi
    record $name "rc=$? ($((SECONDS - start)) s)"
  fi
done

# ogbl-ddi's runs are bound by their host thread: one process per backend and seed, all at once.
if stage accuracy; then
  start=$SECONDS
  mkdir -p "$OUT/accuracy"
  OUT="$OUT/accuracy" timeout "$STAGE_LIMIT" $PY -m benchmarks.gcn --parts accuracy --data-root .devdata \
    --accuracy-datasets ogbl-ddi --parallel 20 ${ACCURACY_ARGS:-} >"$OUT/accuracy.log" 2>&1
  record accuracy "rc=$? ($((SECONDS - start)) s)"
fi

echo
printf '%s\n' "${summary[@]}"
grep -q "FAILED\|Error" "$OUT/test.log" 2>/dev/null && grep -E "^(FAILED|ERROR)" "$OUT/test.log" | head -20
grep -E "^(FAILED|ERROR)" "$OUT/suite.log" 2>/dev/null | head -20
for name in rows reorder permutation selector gcn host_overhead compiled accuracy; do
  if stage $name; then
    [ -f "$OUT/$name-baseline.log" ] && { echo "== $name (baseline)"; tail -40 "$OUT/$name-baseline.log"; }
    echo "== $name"; tail -40 "$OUT/$name.log"
  fi
done
if stage bench; then sed -n '/^CSR -> ME-TCF/,$p' "$OUT/bench.log"; fi
for log in "$OUT/bench-compare.log" "$OUT/host_overhead-compare.log"; do
  [ -f "$log" ] && { echo "== $(basename "$log" .log)"; cat "$log"; }
done
