# The other four single-GPU rows of kv_sizing's DEFAULT_PLAN, before and after the planner refactor.
# Same set-up as kv_sizing_before_after.sh (the two fit one 10-minute device call each).
set -o pipefail
source scripts/device/env.sh
mkdir -p /tmp/before && tar -xf .device/kv_sizing_before.tar -C /tmp/before
for tree in before after; do
  if [ $tree = before ]; then root=/tmp/before; else root=$PWD; fi
  (cd $root && PYTHONPATH=/tmp/site python3 benchmark/kv_sizing/bench_kv_sizing.py --out $OUT/$tree \
      --shapes Llama-3.1-8B --flag-sets max-running-256 &&
   PYTHONPATH=/tmp/site python3 benchmark/kv_sizing/bench_kv_sizing.py --out $OUT/$tree --append \
      --shapes Qwen3-8B --flag-sets default graph-bs-32+max-running-256 &&
   PYTHONPATH=/tmp/site python3 benchmark/kv_sizing/bench_kv_sizing.py --out $OUT/$tree --append \
      --shapes Qwen3-30B-A3B --flag-sets graph-bs-32+max-running-256) 2>&1 | grep "^|" | tail -6 | tee -a $OUT/kv_sizing_rest.log
done
