# Serving overlap on the H200 (issue 15): the GPU tests of the scheduler and graph paths, then upstream's
# bench_serving against the post-capture server with overlap scheduling on and off.
# Needs .device/upstream (python benchmark/serving/bench_serving_h200.py --prepare) and ../shared/device/stage.sh.
# Device call: run(command="bash scripts/device/overlap.sh [tests|bench|all] [bench_serving_h200.py args]", carry=[".device"])
set -o pipefail
source scripts/device/env.sh
stage=${1:-all}; shift || true
if [ "$stage" = tests ] || [ "$stage" = all ]; then
  python3 -m pytest -v -rfEs -x --timeout 400 test/registered/scheduler/test_overlap_schedule_gpu.py \
    test/registered/model_executor/test_cuda_graph_gpu.py test/registered/scheduler/test_oom_recovery_gpu.py \
    test/registered/moe/test_kt_hybrid_decode_gpu.py 2>&1 | tee $OUT/overlap_gpu_tests.log | \
    grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Error" | tail -30
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  python3 benchmark/serving/bench_serving_h200.py --out-dir $OUT/serving --paths post-capture \
    --variants "overlap=" "no-overlap=--disable-overlap-schedule" "$@" 2>&1 | tee $OUT/bench_serving_overlap.log | tail -25
fi
