# Session 22 (issue 15): GPU checks of the files edited since their last GPU run, then whether prefill and decode
# can share the GPU at once (benchmark/serving/bench_prefill_decode_overlap.py). Stages run in the order given.
# tests: the decode GEMM / attention / quantization units, the model-level GPU tests and the KT hybrid decode ones.
# roofline: benchmark/decode_roofline/bench_decode_roofline.py (gated kernel: x loaded once per K step).
# kvdtype: bench_kv_cache_dtype.py (the fp16-vs-bf16 dots comparison through DecodeKernelConfig now).
# overlap: the prefill / decode concurrency benchmark (two streams, stream priority, green-context partitions).
# tests-sched: the scheduler's GPU tests (overlap loop, OOM recovery). serving: upstream's bench_serving (OpenAI
# client) at concurrency 1 / 64 / 256 against the post-capture server, the default flags. serving-fp8: the same at
# concurrency 256 only, bf16 and --quantization fp8 servers one after the other.
# Device calls of session 22 (log benchmark/logs/2026-12-02-session22-h200.log): run 1 "... tests overlap roofline
# kvdtype", run 2 "... overlap serving tests-sched": run(command="bash scripts/device/prefill_decode_overlap.sh
# overlap serving tests-sched", carry=[".device"]). serving needs .device/upstream (bench_serving_h200.py --prepare).
set -o pipefail
source scripts/device/env.sh
for stage in "$@"; do
  echo "== $stage $(date +%T)"
  if [ "$stage" = tests ]; then
    python3 -m pytest -q -rfE --timeout 500 test/unit/layers/decode_gemm test/unit/layers/attention \
      test/unit/layers/quantization test/registered/model_executor/test_decode_gemm_gpu.py \
      test/registered/models/test_gpu_vs_transformers.py test/registered/model_executor/test_fp8_quantization_gpu.py \
      test/registered/model_executor/test_cuda_graph_gpu.py test/registered/moe/test_kt_hybrid_decode_gpu.py 2>&1 | \
      tee $OUT/gpu_tests.log | grep -E "passed|failed|FAILED|Error" | tail -12
  fi
  if [ "$stage" = roofline ]; then
    python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --out $OUT/roofline 2>&1 | \
      tr '\r' '\n' | grep -B2 -A9 "^| batch"
  fi
  if [ "$stage" = kvdtype ]; then
    python3 benchmark/decode_roofline/bench_kv_cache_dtype.py --out $OUT/kv_cache_dtype 2>&1 | tail -9
  fi
  if [ "$stage" = overlap ]; then
    python3 benchmark/serving/bench_prefill_decode_overlap.py --out $OUT/prefill_decode_overlap \
      2>&1 | tr '\r' '\n' | grep -vE "Capturing|it/s\]|^\s*$" | tail -40
  fi
  if [ "$stage" = tests-sched ]; then
    python3 -m pytest -q -rfE --timeout 400 test/registered/scheduler/test_overlap_schedule_gpu.py test/registered/model_executor/test_cuda_graph_gpu.py \
      test/registered/scheduler/test_oom_recovery_gpu.py 2>&1 | tee $OUT/gpu_tests_sched.log | \
      grep -E "passed|failed|FAILED|Error" | tail -8
  fi
  if [ "$stage" = serving ]; then
    python3 benchmark/serving/bench_serving_h200.py --out-dir $OUT/serving --paths post-capture --backend sglang-oai \
      --variants "overlap=" \
      --graph-steps-from benchmark/decode_roofline/gated_x_once/results.json 2>&1 | tee $OUT/bench_serving.log | tail -22
  fi
  if [ "$stage" = serving-fp8 ]; then  # concurrency 256 only: bf16 and --quantization fp8 on one machine
    python3 benchmark/serving/bench_serving_h200.py --out-dir $OUT/serving_fp8 --paths post-capture \
      --backend sglang-oai --concurrency 256 --num-prompts 512 --variants "bf16=" "fp8=--quantization fp8" \
      2>&1 | tee $OUT/bench_serving_fp8.log | tail -16
  fi
done
echo "== done $(date +%T)"
