# Which stream path wins on the H200 host (issue 17): zero-copy step buffers and yielding CUDA waits, on and off.
# Device call: run(command="bash scripts/device/kt_decode_variants.sh", carry=[".device"])
set -o pipefail
source scripts/device/env.sh
args="--methods BF16 INT8 --batches 1 16"
for variant in "1 1" "0 1" "1 0"; do
  set -- $variant
  echo "== SGLANG_KT_CPU_ZERO_COPY=$1 SGLANG_KT_CPU_YIELDING_SYNC=$2"
  SGLANG_KT_CPU_ZERO_COPY=$1 SGLANG_KT_CPU_YIELDING_SYNC=$2 python3 benchmark/kt_decode/bench_kt_decode.py $args \
    --out $OUT/zc$1-ys$2 2>&1 | grep -E "graph=True|bandwidth|could not|not mapped"
done
