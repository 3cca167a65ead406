#!/usr/bin/env bash
# Compile every CUDA kernel file of torch_tcsparse/csrc for sm_80 and sm_90 with nvcc alone (no
# torch headers), and the selector's C++ model and the CPU conversion's passes with g++; fail on
# any error or warning, and print registers / spills per kernel from ptxas.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "compile_kernels: nvcc not found (set NVCC)"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pids=()
for src in torch_tcsparse/csrc/*.cu; do
  for arch in 80 90; do
    log="$out/$(basename "$src" .cu).sm_$arch.log"
    "$NVCC" -std=c++17 -O3 -gencode "arch=compute_$arch,code=sm_$arch" -Xptxas -v -Werror all-warnings \
      -Itorch_tcsparse/csrc -c "$src" -o "$out/$(basename "$src" .cu).sm_$arch.o" >"$log" 2>&1 &
    pids+=("$!:$log")
  done
done
# The selector's C++ model and its C interface are plain C++, built at run time by selector/build.py.
log="$out/selector_model.log"
${CXX:-g++} -std=c++17 -O2 -Wall -Wextra -Werror -c torch_tcsparse/csrc/selector_model.cpp -o "$out/selector_model.o" \
  >"$log" 2>&1 &
pids+=("$!:$log")
log="$out/selector_capi.log"
${CXX:-g++} -std=c++17 -O2 -Wall -Wextra -Werror -Itorch_tcsparse/csrc -c torch_tcsparse/csrc/selector_capi.cpp \
  -o "$out/selector_capi.o" >"$log" 2>&1 &
pids+=("$!:$log")
# The CPU conversion's passes, plain C++ too, built at run time by formats/native.py.
for name in cpu_transpose cpu_metcf; do
  log="$out/$name.log"
  ${CXX:-g++} -std=c++17 -O2 -Wall -Wextra -Werror -pthread -Itorch_tcsparse/csrc -c "torch_tcsparse/csrc/$name.cpp" \
    -o "$out/$name.o" >"$log" 2>&1 &
  pids+=("$!:$log")
done
failed=0
for entry in "${pids[@]}"; do
  pid=${entry%%:*}; log=${entry#*:}
  if ! wait "$pid"; then echo "FAILED: $log"; cat "$log"; failed=1; fi
done
# One line per kernel: arch, registers, spill bytes, shared memory, demangled name.
for log in "$out"/*.log; do
  awk -v file="$(basename "$log" .log)" '
    /Compiling entry function/ { match($0, /'\''[^'\'']+'\''/); name = substr($0, RSTART + 1, RLENGTH - 2) }
    /spill stores/ { stores = $5; loads = $9 }
    /Used [0-9]+ registers/ { regs = $5; smem = "0"; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11);
                              printf "%-18s regs %3d  spill st/ld %s/%s  smem %6s  %s\n", file, regs, stores, loads, smem, name }' "$log"
done | c++filt | sed -E 's/tcsparse::\(anonymous namespace\):://g; s/\(tcsparse::MetcfArrays.*$//'
if grep -l -E "[1-9][0-9]* bytes spill (stores|loads)" "$out"/*.log >/dev/null 2>&1; then echo "note: some kernels spill (see above)"; fi
exit $failed
