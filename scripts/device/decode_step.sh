# Session 20 (issue 15): GPU checks of the files edited since their last GPU run, then the decode step's
# attention (grid order), its profile and the roofline. Stages run in the order given.
# roofline-qkvo64: the roofline with qkv and o at batch 33-64 on their best skinny config (gemm_tuning/results.json)
# instead of cuBLAS: a cuBLAS kernel ends the chain of PDL launches, which the tuner's GEMM-alone timing misses.
# tune-silu: tune gate_up with SiLU-and-mul in the skinny kernel's epilogue (the table lands in the package's
# configs/ on the device, so later stages of the same call use it, and in $OUT). tests-gemm: the GEMM-path GPU tests.
# ab: the roofline four times, alternating before (no :silu table entries, kv_heads_adjacent false) and after
# (the shipped table, the default grid), then once more with qkv / o at batch 64 on the skinny kernel.
# tests-attn: decode attention's GPU tests and the model-level ones; ab-direct: the roofline with one-chunk requests
# merged by stage 2 (before) and written by stage 1 (after, the default).
# Session 21: tune-wide: retune the bf16 table at batch 16-64 with wide tiles in the split-K sweep (other batches
# stay); the table it started from goes to $OUT/table_before_tune-wide, the result to $OUT/table_after_tune-wide.
# tests-kt: the KT hybrid decode GPU tests (the Qwen3-MoE decoder). ab-addnorm: the roofline of the commit before
# (first, here: git archive HEAD~1 python benchmark scripts | tar -x -C ab_before; untracked, so it travels, and
# never committed), of this tree, and of this tree with o_proj at batch 64 on its best skinny config; twice.
# Device call: run(command="bash scripts/device/decode_step.sh tune-silu tests-gemm roofline", carry=[".device"])
set -o pipefail
source scripts/device/env.sh
for stage in "$@"; do
  echo "== $stage $(date +%T)"
  if [ "$stage" = tests ]; then
    python3 -m pytest -q -rfEs --timeout 500 test/registered/moe/test_kt_hybrid_decode_gpu.py \
      test/registered/moe/test_kt_prefill_reservation_gpu.py test/registered/moe/test_kt_elastic_slot_gpu.py \
      test/unit/layers/quantization test/unit/layers/decode_gemm test/unit/layers/attention \
      test/registered/model_executor/test_fp8_quantization_gpu.py test/registered/model_executor/test_cuda_graph_gpu.py \
      test/registered/models/test_gpu_vs_transformers.py 2>&1 | tee $OUT/gpu_tests.log | \
      grep -E "passed|failed|FAILED|Error" | tail -15
  fi
  if [ "$stage" = tune-silu ]; then
    python3 benchmark/decode_roofline/tune_decode_gemms.py --silu --out $OUT/gemm_tuning_silu 2>&1 | tail -12
    cp python/sglang/srt/layers/decode_gemm/configs/NVIDIA_H200.json $OUT/
  fi
  if [ "$stage" = tune-wide ]; then
    table=python/sglang/srt/layers/decode_gemm/configs/NVIDIA_H200.json
    mkdir -p $OUT/table_before_$stage $OUT/table_after_$stage && cp $table $OUT/table_before_$stage/
    python3 benchmark/decode_roofline/tune_decode_gemms.py --batches 16 32 64 --out $OUT/gemm_tuning_wide 2>&1 | tail -20
    cp $table $OUT/table_after_$stage/
  fi
  if [ "$stage" = tests-kt ]; then
    python3 -m pytest -q -rfE --timeout 300 test/registered/moe/test_kt_hybrid_decode_gpu.py 2>&1 | \
      tee $OUT/gpu_tests_kt.log | grep -E "passed|failed|FAILED|Error" | tail -8
  fi
  if [ "$stage" = ab-addnorm ]; then  # before: ab_before/ (git archive of the commit before, untracked)
    mkdir -p $OUT/table_o64 && python3 - $OUT/table_o64 <<'PY'
import json, sys
table = json.load(open("python/sglang/srt/layers/decode_gemm/configs/NVIDIA_H200.json"))
rows = json.load(open("benchmark/decode_roofline/gemm_tuning/results.json"))["rows"]
(o64,) = [r for r in rows if r["batch"] == 64 and r["gemm"] == "o"]
table["shapes"][f"{o64['n']}x{o64['k']}"]["64"] = o64["best_skinny_config"]
print("batch 64 o_proj", o64["best_skinny_config"])
json.dump(table, open(sys.argv[1] + "/NVIDIA_H200.json", "w"), indent=1)
PY
    for i in 1 2; do
      python3 ab_before/benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --out $OUT/roofline_before_$i \
        2>&1 | tr '\r' '\n' | grep -A5 "^| batch" | sed "s/^/before$i /"
      python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --out $OUT/roofline_after_$i 2>&1 | \
        tr '\r' '\n' | grep -A5 "^| batch" | sed "s/^/after$i /"
      SGLANG_DECODE_GEMM_CONFIG_DIR=$OUT/table_o64 python3 benchmark/decode_roofline/bench_decode_roofline.py \
        --skip-hf --out $OUT/roofline_o64_$i 2>&1 | tr '\r' '\n' | grep -A5 "^| batch" | sed "s/^/o64_$i /"
    done
  fi
  if [ "$stage" = tests-gemm ]; then
    python3 -m pytest -q -s -rfEs --timeout 500 test/unit/layers/decode_gemm test/unit/layers/quantization \
      test/registered/model_executor/test_decode_gemm_gpu.py test/registered/models/test_gpu_vs_transformers.py \
      test/registered/model_executor/test_fp8_quantization_gpu.py test/registered/model_executor/test_cuda_graph_gpu.py \
      2>&1 | tee $OUT/gpu_tests_gemm.log | grep -E "passed|failed|FAILED|Error|cosine|relative error" | tail -15
  fi
  if [ "$stage" = tests-attn ]; then
    python3 -m pytest -q -rfE --timeout 300 test/unit/layers/attention test/registered/models/test_gpu_vs_transformers.py \
      test/registered/model_executor/test_cuda_graph_gpu.py 2>&1 | tee $OUT/gpu_tests_attn.log | \
      grep -E "passed|failed|FAILED|Error" | tail -8
  fi
  if [ "$stage" = ab-direct ]; then
    python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --decode-config '{"single_split_direct": false}' \
      --out $OUT/roofline_stage2 2>&1 | tr '\r' '\n' | grep -A5 "^| batch" | sed "s/^/stage2 /"
    python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --out $OUT/roofline_direct 2>&1 | \
      tr '\r' '\n' | grep -A5 "^| batch" | sed "s/^/direct /"
  fi
  if [ "$stage" = tune ]; then
    python3 benchmark/decode_roofline/tune_decode_attention.py --focused --out $OUT/attention_tuning 2>&1 | tail -12
  fi
  if [ "$stage" = profile ]; then
    for pdl in 0 1; do
      SGLANG_ENABLE_PDL=$pdl python3 benchmark/decode_roofline/profile_decode_step.py --batches 64 256 --top 12 \
        2>&1 | grep -v Warning | tail -34 | sed "s/^/pdl$pdl /"
    done
  fi
  if [ "$stage" = roofline-qkvo64 ]; then
    mkdir -p $OUT/table_qkvo64 && python3 - $OUT/table_qkvo64 <<'PY'
import json, sys
table = json.load(open("python/sglang/srt/layers/decode_gemm/configs/NVIDIA_H200.json"))
rows = json.load(open("benchmark/decode_roofline/gemm_tuning/results.json"))["rows"]
for r in rows:
    if r["batch"] == 64 and r["gemm"] in ("qkv", "o"):
        table["shapes"][f"{r['n']}x{r['k']}"]["64"] = r["best_skinny_config"]
        print("batch 64", r["gemm"], r["best_skinny_config"])
json.dump(table, open(sys.argv[1] + "/NVIDIA_H200.json", "w"), indent=1)
PY
    SGLANG_DECODE_GEMM_CONFIG_DIR=$OUT/table_qkvo64 python3 benchmark/decode_roofline/bench_decode_roofline.py \
      --skip-hf --out $OUT/roofline_qkvo64 2>&1 | tr '\r' '\n' | grep -A5 "^| batch" | sed "s/^/qkvo64 /"
  fi
  if [ "$stage" = ab ]; then
    mkdir -p $OUT/table_before && python3 - $OUT/table_before <<'PY'
import json, sys
table = json.load(open("python/sglang/srt/layers/decode_gemm/configs/NVIDIA_H200.json"))
table["shapes"] = {k: v for k, v in table["shapes"].items() if not k.endswith(":silu")}
json.dump(table, open(sys.argv[1] + "/NVIDIA_H200.json", "w"), indent=1)
PY
    for i in 1 2; do
      SGLANG_DECODE_GEMM_CONFIG_DIR=$OUT/table_before python3 benchmark/decode_roofline/bench_decode_roofline.py \
        --skip-hf --decode-config '{"kv_heads_adjacent": false}' --out $OUT/roofline_before_$i 2>&1 | tr '\r' '\n' | \
        grep -A5 "^| batch" | sed "s/^/before$i /"
      python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --out $OUT/roofline_after_$i 2>&1 | \
        tr '\r' '\n' | grep -A5 "^| batch" | sed "s/^/after$i /"
    done
  fi
  if [ "$stage" = roofline ]; then
    python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --out $OUT/roofline 2>&1 | tr '\r' '\n' | grep -A11 "^Llama"
  fi
done
