#!/usr/bin/env bash
# Checks the wheel as a user without a compiler would meet it, for a maintainer on a machine with an
# NVIDIA GPU, the CUDA toolkit and a CUDA build of torch: build the wheel with this machine's torch
# and nvcc (no network), install it into a folder of its own first on the path, hide nvcc (off the
# PATH, CUDA_HOME unset, an empty build cache), check that the prebuilt kernels serve, then run
# the GPU tests against the installed package from a folder outside the checkout. Ends with one
# line; the wheel and the logs stay in $OUT.
#
#   scripts/wheel_check.sh          build the wheel into $OUT (default out/), install it, test it
#   scripts/wheel_check.sh build    only build the wheel into $OUT
#   WHEEL=path/to/torch_tcsparse-*.whl scripts/wheel_check.sh
#                                   install and test a wheel built before (e.g. on a machine with
#                                   another GPU; the git-ignored .whl/ is a place to keep it)
#   TORCH_CUDA_ARCH_LIST            the architectures the wheel is built for (default 8.0;9.0+PTX)
#   PYTHON                          the interpreter whose torch builds and runs it (default python3)
#   STAGE_LIMIT                     caps the GPU tests (seconds, default 420)
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
OUT=${OUT:-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
case "${1:-all}" in build|all) ;; *) echo "usage: scripts/wheel_check.sh [build]"; exit 2;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)

if [ -z "${WHEEL:-}" ]; then
  start=$SECONDS
  # From a copy without earlier builds, data or results, so that the wheel is built from the
  # sources alone and the build's folders stay out of the checkout.
  mkdir -p "$work/src"
  tar --exclude=./.git --exclude=./.devdata --exclude=./.whl --exclude=./build --exclude=./out \
    --exclude='*.egg-info' --exclude=./.venv -cf - . | tar -xf - -C "$work/src"
  if ! (cd "$work/src" && TCSPARSE_BUILD_CUDA=1 $PY -m pip wheel --no-deps --no-build-isolation --wheel-dir "$OUT" .) \
      >"$OUT/wheel_build.log" 2>&1; then
    tail -40 "$OUT/wheel_build.log"
    echo "wheel_check: FAILED to build the wheel on $gpu"
    exit 1
  fi
  WHEEL=$(ls -t "$OUT"/torch_tcsparse-*.whl | head -1)
  echo "built $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1)) in $((SECONDS - start)) s"
  [ "${1:-all}" = build ] && exit 0
fi
WHEEL=$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")

# The wheel alone goes into a folder of its own, first on the path; torch and the package's needs
# come from $PY's environment (a venv with --system-site-packages would not see them when $PY is
# itself a venv's interpreter).
site="$work/site"
$PY -m pip install -q --no-deps --no-index --target "$site" "$WHEEL" || { echo "wheel_check: FAILED to install $WHEEL"; exit 1; }

path_without_nvcc=$(tr ':' '\n' <<<"$PATH" | while read -r dir; do
  [ -n "$dir" ] && [ ! -e "$dir/nvcc" ] && printf '%s:' "$dir"; done)
no_compiler=(env -u CUDA_HOME -u CUDA_PATH PATH="${path_without_nvcc%:}" PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
             TCSPARSE_BUILD_DIR="$work/empty_cache")

# The tests and their conftest files, outside the checkout: torch_tcsparse is then the installed one.
mkdir -p "$work/run/tests"
cp "$repo/tests/conftest.py" "$work/run/tests/"
cp -r "$repo/tests/gpu" "$work/run/tests/"
printf '[pytest]\nmarkers =\n    gpu: needs a CUDA device\n    slow: takes more than a few seconds\n' >"$work/run/pytest.ini"
cd "$work/run"

if ! served=$("${no_compiler[@]}" $PY -c "
import torch_tcsparse
from torch_tcsparse import _ext
assert torch_tcsparse.__file__.startswith('$site/'), 'not the installed package: ' + torch_tcsparse.__file__
module, why_not = _ext._prebuilt()
assert module is not None, why_not or 'the wheel holds no prebuilt kernels'
assert _ext.is_prebuilt(_ext.load())
print(module.__file__)" 2>&1); then
  echo "$served" | tail -20
  echo "wheel_check: FAILED on $gpu: the installed wheel's prebuilt kernels do not serve"
  exit 1
fi
echo "prebuilt kernels: ${served#"$site"/}"

"${no_compiler[@]}" timeout "${STAGE_LIMIT:-420}" $PY -m pytest -q -p no:cacheprovider tests/gpu >"$OUT/wheel_tests.log" 2>&1
rc=$?
grep -E "^(FAILED|ERROR)" "$OUT/wheel_tests.log" | head -20
echo "wheel_check: $(basename "$WHEEL") on $gpu without nvcc: rc=$rc $(tail -1 "$OUT/wheel_tests.log")"
exit $rc
