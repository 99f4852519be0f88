# KT hybrid decode on the H200 machine (issue 17): the kernel's CPU tests on that host, the GPU tests of the
# stream / CUDA-graph path, then benchmark/kt_decode. Stages: "smoke" (tests + a short bench), "tests", "bench",
# "all" (tests, then the bench with the given args), "probe" (the step hand-over by mechanism: probe_doorbell.py),
# "kernel" (the CPU kernel alone: bench_cpu_kernel.py with the given args).
# Device call: run(command="bash scripts/device/kt_decode.sh <stage> [bench args]", carry=[".device"])
set -o pipefail
source scripts/device/env.sh
stage=${1:-smoke}; shift || true
echo "host: $(nproc) CPUs, $(lscpu | grep 'Model name' | sed 's/  */ /g'), $(g++ --version | head -1)"
lscpu | grep -o -E 'amx[a-z0-9_]*|avx512_bf16|avx512f ' | sort -u | tr '\n' ' '; echo
if [ "$stage" = smoke ] || [ "$stage" = tests ] || [ "$stage" = all ]; then
  tests="test/unit/layers/moe/test_cpu_experts_kernel.py test/registered/moe/test_kt_hybrid_decode_gpu.py test/registered/moe/test_kt_hybrid_moe.py"
  [ "$stage" != smoke ] && tests="$tests test/registered/moe/test_kt_prefill_reservation_gpu.py \
    test/registered/moe/test_kt_elastic_slot_gpu.py test/registered/model_executor/test_cuda_graph_gpu.py"
  python3 -m pytest -v -rfEs --timeout 400 $tests -k "not FP8 or cpu_experts_kernel" 2>&1 | \
    tee $OUT/kt_decode_tests.log | grep -E "FAILED|ERROR|SKIPPED|passed|failed|Error" | tail -30
fi
if [ "$stage" = smoke ]; then
  timeout 300 python3 benchmark/kt_decode/bench_kt_decode.py --methods BF16 INT8 --batches 1 16 --out $OUT/bench "$@" 2>&1 | \
    tee $OUT/bench_kt_decode.log | grep -v Warning | tail -30
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  python3 benchmark/kt_decode/bench_kt_decode.py --out $OUT/bench "$@" 2>&1 | tee $OUT/bench_kt_decode.log | \
    grep -v Warning | tail -60
fi
if [ "$stage" = probe ]; then
  timeout 180 python3 benchmark/kt_decode/probe_doorbell.py --out $OUT/doorbell "$@" 2>&1 | tee $OUT/probe_doorbell.log | \
    grep -v Warning | tail -16
fi
if [ "$stage" = kernel ]; then
  timeout 240 python3 benchmark/kt_decode/bench_cpu_kernel.py --out $OUT/cpu_kernel "$@" 2>&1 | tee $OUT/bench_cpu_kernel.log | \
    grep -v Warning | tail -20
fi
