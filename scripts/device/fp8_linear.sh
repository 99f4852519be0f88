# --quantization fp8 on the H200 (issue 15): the fp8 GPU tests, tuning the skinny kernel on fp8 operands against
# torch._scaled_mm (the table lands in the package's configs/ on the device and in $OUT), the projection bench,
# the decode roofline with fp8 linear layers, and upstream's bench_serving at concurrency 256, bf16 vs fp8.
# Needs .device/upstream (python benchmark/serving/bench_serving_h200.py --prepare) and ../shared/device/stage.sh.
# Device call: run(command="bash scripts/device/fp8_linear.sh [tests|tune|gemms|roofline|serving]...", carry=[".device"])
set -o pipefail
source scripts/device/env.sh
table=python/sglang/srt/layers/decode_gemm/configs/NVIDIA_H200.json
for stage in "$@"; do
  echo "== $stage $(date +%T)"
  if [ "$stage" = tests ]; then
    python3 -m pytest -q -s -rfEs --timeout 400 test/unit/layers/quantization test/unit/layers/decode_gemm \
      test/registered/model_executor/test_fp8_quantization_gpu.py test/registered/model_executor/test_decode_gemm_gpu.py \
      2>&1 | tee $OUT/fp8_gpu_tests.log | grep -E "passed|failed|Error|cosine" | tail -12
  fi
  if [ "$stage" = tune ]; then
    python3 benchmark/decode_roofline/tune_decode_gemms.py --fp8 --out $OUT/gemm_tuning_fp8 2>&1 | tail -32
    cp $table $OUT/
  fi
  if [ "$stage" = gemms ]; then
    python3 benchmark/fp8_linear/bench_fp8_gemms.py --out $OUT/fp8_gemms 2>&1 | tail -32
  fi
  if [ "$stage" = roofline ]; then
    for q in bf16 fp8; do
      flag=""; [ $q = fp8 ] && flag="--quantization fp8"
      python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf $flag --out $OUT/roofline_$q \
        2>&1 | tr '\r' '\n' | grep -A11 "^Llama"
    done
  fi
  if [ "$stage" = serving ]; then
    python3 benchmark/serving/bench_serving_h200.py --out-dir $OUT/serving --paths post-capture --backend sglang-oai \
      --concurrency 256 --num-prompts 512 --variants "bf16=" "fp8=--quantization fp8" \
      "fp8-fp8kv=--quantization fp8 --kv-cache-dtype fp8_e4m3" 2>&1 | tee $OUT/bench_serving_fp8.log | tail -30
  fi
done
