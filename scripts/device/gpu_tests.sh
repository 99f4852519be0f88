# GPU tests of this session's CUDA-path changes: OOM recovery (issue 18), graphs + sampler/logits (19), KT and planner (13).
# Device call: run(command="bash scripts/device/gpu_tests.sh", carry=[".device"]) after ../shared/device/stage.sh
set -o pipefail
source scripts/device/env.sh
python3 -m pytest -v -s -x --timeout 560 test/registered/scheduler/test_oom_recovery_gpu.py \
  test/registered/model_executor/test_cuda_graph_gpu.py test/unit/layers/test_sampler.py \
  test/registered/models/test_gpu_vs_transformers.py \
  "test/registered/moe/test_kt_prefill_reservation_gpu.py" -k "not FP8" 2>&1 | tee $OUT/gpu_tests.log | \
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|agreement|reservation|recover|neighbour|tokens|Error" | tail -60
