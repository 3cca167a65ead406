#!/usr/bin/env bash
# The rows kernel's check in one device run: build the kernels for this GPU alone (with BASELINE,
# a directory holding another checkout, its rows kernel too, beside them), run
# tests/gpu/test_rows.py, then benchmarks/rows.py (the rows kernel against its floors, cuSPARSE,
# the baseline's rows kernel and, with PEERS=rode, RoDe on large generated graphs at N = 32, 64,
# 128 and 256 in float32, float16 and bfloat16). The benchmark's short table comes last; logs and
# rows.csv go into $OUT.
#
#   BASELINE=.devdata/baseline scripts/rows_check.sh
#   BENCH_ARGS="--nnz 4000000 --families uniform,road" scripts/rows_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
# The GPU's own architecture only: building the library is most of the run.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($PY -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}
export TCSPARSE_BUILD_DIR=${TCSPARSE_BUILD_DIR:-$PWD/.devdata/build-rows}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
BASELINE=${BASELINE:-}
PEERS=${PEERS:-}
start=$SECONDS

if [ -n "$BASELINE" ]; then
  $PY -m benchmarks.rows --baseline "$BASELINE" --build-only --out "$OUT" >"$OUT/build-baseline.log" 2>&1 &
  baseline_build=$!
fi
if ! $PY -m torch_tcsparse._ext >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
if [ -n "$BASELINE" ] && ! wait "$baseline_build"; then
  tail -20 "$OUT/build-baseline.log"; echo "baseline build failed: the benchmark runs without it"; BASELINE=
fi
echo "build: $((SECONDS - start)) s (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"

start=$SECONDS
timeout "${TEST_LIMIT:-200}" $PY -m pytest -q --maxfail=5 -p no:cacheprovider tests/gpu/test_rows.py \
  >"$OUT/test_rows.log" 2>&1
test_rc=$?
grep -E "^(FAILED|ERROR)" "$OUT/test_rows.log" | cut -c1-300 | head -10
echo "tests/gpu/test_rows.py: rc=$test_rc ($((SECONDS - start)) s): $(tail -1 "$OUT/test_rows.log")"

start=$SECONDS
timeout "${BENCH_LIMIT:-300}" $PY -m benchmarks.rows --out "$OUT" ${BASELINE:+--baseline "$BASELINE"} \
  ${PEERS:+--peers "$PEERS"} ${BENCH_ARGS:-} 2>&1 | tee "$OUT/rows_bench.log"
echo "benchmark: rc=${PIPESTATUS[0]} ($((SECONDS - start)) s); tests rc=$test_rc"
