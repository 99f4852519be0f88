# kv_sizing with the code before the planner refactor (HEAD 406da61) and after, same machine, same rows.
# Needs .device/kv_sizing_before.tar, made here first: git archive 406da61 -o .device/kv_sizing_before.tar python scripts benchmark/kv_sizing
# Device call: run(command="bash scripts/device/kv_sizing_before_after.sh", carry=[".device"]) after ../shared/device/stage.sh
set -o pipefail
source scripts/device/env.sh
mkdir -p /tmp/before && tar -xf .device/kv_sizing_before.tar -C /tmp/before
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
for tree in before after; do
  if [ $tree = before ]; then root=/tmp/before; else root=$PWD; fi
  (cd $root && PYTHONPATH=/tmp/site python3 benchmark/kv_sizing/bench_kv_sizing.py --out $OUT/$tree \
      --shapes Llama-3.1-8B --flag-sets default graph-bs-32+max-running-256 &&
   PYTHONPATH=/tmp/site python3 benchmark/kv_sizing/bench_kv_sizing.py --out $OUT/$tree --append \
      --shapes Qwen3-30B-A3B --flag-sets default) 2>&1 | tail -40 | tee -a $OUT/kv_sizing.log
done
