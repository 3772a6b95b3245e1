#!/usr/bin/env bash
# The GPU evidence of a stage, made on a lent GPU machine in one call of the device tool (under
# its 10-minute limit), from the repository root of a bare checkout:
#
#   bash tools/gpu_evidence.sh [tests|suite|all]     (default: all)
#
# tests: the GPU tests (kernels, SGLang's kernels, the CUDA device, gates, the recorder's GPU
#        mode) and the recorder corpus report (forced delays, GPU vs CPU verdicts, CSAN);
# suite: the bundled suite replayed on CUDA streams (gpu-check), CSAN on a time budget.
# The machine's image has torch with CUDA but no simpy and no sglang: they travel in .whl/
# (wheels, with what sglang's import needs beyond the image: orjson, pydantic, IPython...; sglang 0.5.23's cp311 wheel unpacked without its native extensions, which the
# FutureMap and its Triton kernels do not use). Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-evidence}
mkdir -p "$OUT" /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
for t in .whl/*.tar.gz; do [ -e "$t" ] && tar xzf "$t" -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/device.txt"
what=${1:-all}
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout "${TESTS_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu \
    tests/gpu_check tests/recorder 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
  mkdir -p "$OUT/sglang-kernels"  # issue 16 item 5: SGLang's kernels against ours, counted
  timeout 120 python3 tools/sglang_kernels_report.py --out "$OUT/sglang-kernels" > "$OUT/sglang-kernels.log" 2>&1
  grep -m1 verdict "$OUT/sglang-kernels.log"
  mkdir -p "$OUT/recorder"  # its report shares the gpu-check report's file name
  timeout 90 python3 tools/recorder_gpu_report.py --trials 10 --out "$OUT/recorder" > "$OUT/recorder.log" 2>&1
  tail -3 "$OUT/recorder.log"
fi
if [ "$what" = suite ] || [ "$what" = all ]; then
  python3 -m overlap_harness gpu-check scenarios --trials 20 --baseline-trials 10 \
    --with-torch-sanitizer --sanitizer-budget "${SANITIZER_BUDGET:-45}" --out "$OUT" \
    --deadline "${DEADLINE:-240}" > "$OUT/gpu-check.log" 2>&1
  tail -30 "$OUT/gpu-check.log"
fi
