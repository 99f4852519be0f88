# Upstream SGLang's bench_serving against our server (issue 19 item 8).
# Needs .device/upstream (python benchmark/serving/bench_serving_h200.py --prepare) and ../shared/device/stage.sh.
set -o pipefail
source scripts/device/env.sh
python3 benchmark/serving/bench_serving_h200.py --out-dir $OUT 2>&1 | tee $OUT/bench_serving_h200.log | tail -40
