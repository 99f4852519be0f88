# The elastic KT prefill slot on the H200 (issue 14): the arena's real remapping, the slot end to end, the benchmark.
# Device call: run(command="bash scripts/device/kt_elastic.sh", carry=[".device"]) after ../shared/device/stage.sh
set -o pipefail
source scripts/device/env.sh
python3 -m pytest -v -s -x --timeout 300 test/registered/mem_cache/test_vmm_cuda.py \
  test/registered/moe/test_kt_elastic_slot_gpu.py 2>&1 | tee $OUT/kt_elastic_tests.log | \
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|ms|tokens|Error|assert" | tail -40 || exit 1
python3 benchmark/kt_elastic/bench_kt_elastic.py --out $OUT 2>&1 | tee $OUT/bench_kt_elastic.log | tail -25
