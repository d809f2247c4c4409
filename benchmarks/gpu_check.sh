#!/usr/bin/env bash
# One prepared device check for the Triton attention kernels: GPU correctness tests, then the
# kernel benchmark. Run from the repo root on a CUDA machine; results also land in $OUT if set.
#   bash benchmarks/gpu_check.sh
set -uo pipefail
out_dir="${OUT:-/tmp/radixrt_gpu_check}"
mkdir -p "$out_dir"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$out_dir/device.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" \
  | tee -a "$out_dir/device.txt"

timeout 360 python -m pytest -q -m gpu tests/gpu/test_attention_gpu.py -p no:cacheprovider --timeout 300 \
  -x --durations=10 2>&1 | tee "$out_dir/gpu_tests.txt"
tests_rc=${PIPESTATUS[0]}

timeout 180 python benchmarks/bench_attention_kernels.py --dtype bf16 --page-size 16 2>&1 | tee "$out_dir/bench.txt"
bench_rc=${PIPESTATUS[0]}

echo "gpu tests rc=$tests_rc  bench rc=$bench_rc" | tee -a "$out_dir/summary.txt"
exit $(( tests_rc != 0 || bench_rc != 0 ))
