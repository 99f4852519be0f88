# Decode GEMMs on the H200 (issue 15, item 4): tune the skinny kernel against cuBLAS (the table lands in the
# package's configs/ on the device and in $OUT), the kernels' GPU tests, then the decode roofline and the
# step profile in three variants: PDL off + cuBLAS (before), PDL on + cuBLAS, PDL on + the tuned table.
# Device call: run(command="bash scripts/device/decode_gemm.sh [tune|tests|engine|roofline|profile]...", carry=[".device"])
set -o pipefail
source scripts/device/env.sh
table=python/sglang/srt/layers/decode_gemm/configs/NVIDIA_H200.json
variants=${VARIANTS:-"pdl0_tuned0 pdl1_tuned0 pdl1_tuned1"}
run_variant() {  # $1 = pdlX_tunedY, then the command
  local v=$1; shift
  SGLANG_ENABLE_PDL=${v:3:1} SGLANG_DECODE_GEMM_TUNED=${v:10:1} "$@"
}
for stage in "$@"; do
  if [ "$stage" = tune ]; then
    python3 benchmark/decode_roofline/tune_decode_gemms.py --out $OUT/gemm_tuning 2>&1 | tee /tmp/tune_decode_gemms.log | tail -45  # the table lands in gemm_tuning/results.md
    cp $table $OUT/
  fi
  if [ "$stage" = tests ]; then
    python3 -m pytest -q -rfEs --timeout 300 test/unit/layers 2>&1 | tee $OUT/layer_tests.log | tail -4
  fi
  if [ "$stage" = engine ]; then  # the engine's GPU tests with the new kernels (greedy vs transformers, graphs)
    python3 -m pytest -q -rfEs -x --timeout 400 test/registered/models/test_gpu_vs_transformers.py \
      test/registered/model_executor/test_cuda_graph_gpu.py test/registered/model_executor/test_decode_gemm_gpu.py \
      test/registered/scheduler/test_overlap_schedule_gpu.py \
      test/registered/moe/test_kt_hybrid_decode_gpu.py test/registered/scheduler/test_oom_recovery_gpu.py \
      2>&1 | tee $OUT/engine_gpu_tests.log | grep -E "passed|failed|Error|SKIPPED" | tail -12
  fi
  if [ "$stage" = roofline ]; then
    for v in $variants; do
      echo "== $v"
      out=$OUT/roofline_$v; [ $v = pdl1_tuned1 ] || out=/tmp/roofline_$v  # the log has the table; few files back
      run_variant $v python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --out $out \
        2>&1 | tr '\r' '\n' | tee $OUT/roofline_$v.log | grep -A11 "^Llama"
    done
  fi
  if [ "$stage" = profile ]; then
    for v in pdl0_tuned0 pdl1_tuned1; do
      echo "== $v"
      run_variant $v python3 benchmark/decode_roofline/profile_decode_step.py --batches 1 64 --top 12 2>&1 | \
        tee $OUT/profile_$v.log | grep -v Capturing | tail -28
    done
  fi
done
