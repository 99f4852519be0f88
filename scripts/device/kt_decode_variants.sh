# Which stream path wins on the H200 host (issue 17): zero-copy step buffers, and how the scheduler's thread
# waits for the GPU (SGLANG_KT_CPU_HOST_WAIT), each variant in a fresh process.
# Device call: run(command="bash scripts/device/kt_decode_variants.sh [VARIANT...] [-- bench args]", carry=[".device"])
#   VARIANT = <zero copy 0|1>-<block|yield|spin>, default: 1-block 1-yield 0-yield 1-spin
set -o pipefail
source scripts/device/env.sh
variants=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do variants+=("$1"); shift; done
[ "$1" = -- ] && shift
[ ${#variants[@]} -eq 0 ] && variants=(1-block 1-yield 0-yield 1-spin)
args=${*:-"--methods BF16 INT8 --batches 1 16"}
for variant in "${variants[@]}"; do
  zc=${variant%%-*} wait=${variant#*-}
  echo "== SGLANG_KT_CPU_ZERO_COPY=$zc SGLANG_KT_CPU_HOST_WAIT=$wait"
  SGLANG_KT_CPU_ZERO_COPY=$zc SGLANG_KT_CPU_HOST_WAIT=$wait python3 benchmark/kt_decode/bench_kt_decode.py $args \
    --out $OUT/$variant 2>&1 | grep -E "graph=True|bandwidth, 16|could not|not mapped"
done
