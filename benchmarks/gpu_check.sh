#!/usr/bin/env bash
# One prepared device check for the Triton kernels (attention, LoRA): the GPU correctness tests, then the
# kernel benchmark. Run from the repo root on a CUDA machine (radixrt need not be installed:
# the repo root goes on PYTHONPATH). Logs also land in $OUT when it is set.
#   bash benchmarks/gpu_check.sh        # ~3-5 min, most of it compiling kernel variants once
set -uo pipefail
out_dir="${OUT:-/tmp/radixrt_gpu_check}"
mkdir -p "$out_dir"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=$(command -v python3 || command -v python)

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$out_dir/device.txt"
"$py" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" \
  2>&1 | tee -a "$out_dir/device.txt"

timeout 420 "$py" -m pytest -q -m gpu tests/gpu -p no:cacheprovider --timeout 300 \
  --durations=8 -rfE 2>&1 | tee "$out_dir/gpu_tests.txt"
tests_rc=${PIPESTATUS[0]}

timeout 200 "$py" benchmarks/bench_attention_kernels.py --dtype bf16 --page-size 16 2>&1 | tee "$out_dir/bench.txt"
bench_rc=${PIPESTATUS[0]}

echo "gpu tests rc=$tests_rc  bench rc=$bench_rc" | tee "$out_dir/summary.txt"
exit $(( tests_rc != 0 || bench_rc != 0 ))
