#!/usr/bin/env bash
# The CUDA checks and benchmarks of the GPU fast path, for a GPU machine without network access
# (the team's `device` machine): packages come as carried wheels in .whl/ (gguf among them: the
# demo stage converts the GGUF with transformers, which reads it with gguf), the demo GGUF in two
# carried halves (.gguf2/part_aa then .gguf1/part_ab). `bash scripts/gpu_carry.sh [COMMIT]` makes
# .whl, .tok and .old here first. Stages, run in order over one or more calls:
#   bash scripts/gpu_check.sh setup kernels tests     # install, build FlashInfer kernels, pytest -m cuda
#   bash scripts/gpu_check.sh demo serve bench ablations   # the demo model, the server test, benchmarks
#   bash scripts/gpu_check.sh setup kernels verify    # every `cuda` test on this machine's GPUs + a short bench
#   bash scripts/gpu_check.sh setup kernels tp        # kind nvidia-h200-x2: tensor parallelism (tests, 8B bench)
#   bash scripts/gpu_check.sh setup kernels verify tpbench   # kind nvidia-h200-x2: all of it in one call
#   bash scripts/gpu_check.sh setup kernels verify oneserve   # every `cuda` test, then `serve` on one GPU over its sockets
#   bash scripts/gpu_check.sh setup kernels tpserve   # kind nvidia-h200-x2: serve --tp 2 streams a chat, SIGTERM ends it
#   bash scripts/gpu_check.sh setup kernels dpserve dpbench   # kind nvidia-h200-x2: serve --dp 2; bench offline --dp 1/2, routing
#   bash scripts/gpu_check.sh setup loadcache kernels profile savecache   # where the time goes
#   bash scripts/gpu_check.sh setup kernels tpprofile   # kind nvidia-h200-x2: where a --tp 2 step's time goes
#   bash scripts/gpu_check.sh setup loadcache kernels gemvab gemvab8b   # batch-1 decode, the one-row kernel off / on
#   bash scripts/gpu_check.sh setup loadcache kernels gemvvariants bench8b   # the one-row kernel's tiles and loop variants (scripts/gpu_gemv_ab.py)
#   bash scripts/gpu_check.sh setup loadcache kernels decodeab offlineab   # small decode graphs' attention: FlashInfer / Triton
#   bash scripts/gpu_check.sh setup loadcache kernels demo demobench   # the demo model beside transformers (both GGUF halves carried)
#   bash scripts/gpu_check.sh setup loadcache kernels groupab   # the one-row group kernel: tests, plans, 8B int4/int8 decode old/new (carry .old)
#   bash scripts/gpu_check.sh setup loadcache kernels profile8bq   # the 8B batch-1 step kernel by kernel: bf16, fp8, int4
#   bash scripts/gpu_check.sh setup loadcache kernels throughputprofile   # batch 64-256 replays, the offline workload's steps, the 8B's batch-1 step
#   bash scripts/gpu_check.sh setup loadcache kernels attnab profile06b   # attention from qkv: three kernels / one; the 0.6B step kernel by kernel
#   bash scripts/gpu_check.sh setup loadcache kernels offlineprofile   # goal 2: the offline workload's steps against their floors
#   bash scripts/gpu_check.sh setup loadcache kernels offlinekernels gemmsweep   # goal 2: the workload kernel by kernel; the products' tilings
#   bash scripts/gpu_check.sh setup loadcache kernels decodesweep   # the Triton decode attention's tilings, then the offline workload with the best
#   ENVAB_RUNS="MINISGL_PDL_TRIGGER=first :: qwen3-8b decode --input-len 128" bash scripts/gpu_check.sh setup loadcache kernels envab
#   bash scripts/gpu_check.sh setup loadcache kernels fp8 fp8bench   # --kv-dtype fp8: its kernels and agreement, then the benches
#   bash scripts/gpu_check.sh setup kernels groupweights   # 4- and 8-bit weights on the GPU: tests, the one-row kernel's plans, batch-1 decode
#   bash scripts/gpu_check.sh setup kernels fp8weights   # --quantization fp8: its tests, then batch-1 decode bf16 vs fp8 (8B and 0.6B shapes)
#   bash scripts/gpu_check.sh setup loadcache kernels fp8ab   # the offline workload over an FP8 pool with each decode attention
#   bash scripts/gpu_check.sh setup loadcache kernels kernelab oldnew   # this tree against the committed one (carry .old, made by:
#     rm -rf .old && mkdir .old && git archive HEAD engine app | tar -x -C .old && mv .old/engine .old/minisgl_engine && mv .old/app .old/minisgl_app)
# Logs and JSON lines go to $OUT (default /tmp/gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# under /tmp: the device keeps /tmp between calls on a warm machine, not ignored repo folders
W=/tmp/minisgl-gpu-check
# Triton's compiled kernels beside FlashInfer's: savecache carries both (a fresh machine spent
# ~2.5 min compiling Triton's in the first bench of each call)
export FLASHINFER_WORKSPACE_BASE=$W/fi MINISGL_CACHE_DIR=$W/cache TRITON_CACHE_DIR=$W/triton
mkdir -p .pkgs $W/gguf
ln -sfn "$PWD/engine" .pkgs/minisgl_engine
ln -sfn "$PWD/app" .pkgs/minisgl_app
export PYTHONPATH=$PWD/.pkgs:$W/site
CLI=(python3 -m minisgl_app.cli)
status=0

tp_bench() {  # batch-1 decode of the qwen3-8b shape with --tp 1, 2, and 2 with the fused all-reduce + RMSNorm (opt-in);
  # a bench that hangs (at exit, say) is cut off and fails
  for run in 1 2 2fused; do
    local start code tp=${run%fused} mode=""
    [ "$run" = 2fused ] && mode=fused
    start=$(date +%s)
    MINISGL_ALL_REDUCE=$mode timeout 240 "${CLI[@]}" bench decode --device cuda --dummy-weights --config qwen3-8b --input-len 128 --output-len 128 --repeat 3 --tp $tp 2>&1 | tee -a "$OUT/bench_tp.log"
    code=${PIPESTATUS[0]}
    echo "bench --tp $tp ${mode:+(MINISGL_ALL_REDUCE=$mode)}: exit $code after $(( $(date +%s) - start )) s" | tee -a "$OUT/bench_tp.log"
    [ "$code" -eq 0 ] || status=1
  done
}

gemv_ab() {  # SIZE REPEAT TIMEOUT MODES...: batch-1 decode of a Qwen3 shape under each MINISGL_GEMV mode
  local size=$1 repeat=$2 limit=$3 mode; shift 3
  for mode in "$@"; do
    MINISGL_GEMV=$mode timeout "$limit" "${CLI[@]}" -v bench decode --device cuda --dummy-weights --config "qwen3-$size" --input-len 128 --output-len 128 --repeat "$repeat" 2>&1 \
      | grep -E '^\{"bench"|one row|Traceback|Error' | sed "s/^/[$size MINISGL_GEMV=$mode] /" | tee -a "$OUT/gemv_ab.log"
  done
}

serve_check() {  # NAME FLAGS...: `serve FLAGS` answers a streamed chat, then SIGTERM ends every process
  local name=$1; shift
  # the model: qwen3-0.6b's shapes, random weights, the demo tokenizer (carried in .tok/tokenizer)
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  M=$W/serve-model python3 -c '
import os, shutil
from transformers import AutoTokenizer
from minisgl_engine.config import EngineConfig
from minisgl_engine.model_loader import load_hf_config
out = os.environ["M"]
config = load_hf_config(EngineConfig(config="qwen3-0.6b"), None)
config.vocab_size = len(AutoTokenizer.from_pretrained(".tok/tokenizer"))
config.save_pretrained(out)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(f".tok/tokenizer/{name}", out)
' 2>&1 | tee "$OUT/$name.log"
  local port=19321 pid code start left chunks done_line
  "${CLI[@]}" serve "$@" --model $W/serve-model --dummy-weights --device cuda --port $port >>"$OUT/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
  echo "health: $(curl -s localhost:$port/health)" | tee -a "$OUT/$name.log"
  curl -sN localhost:$port/v1/chat/completions -H 'content-type: application/json' \
    -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "stream": true}' >"$OUT/${name}_stream.txt"
  chunks=$(grep -c '^data: {' "$OUT/${name}_stream.txt"); done_line=$(grep -c '^data: \[DONE\]' "$OUT/${name}_stream.txt")
  echo "streamed chunks: $chunks, [DONE]: $done_line" | tee -a "$OUT/$name.log"
  { [ "$chunks" -ge 2 ] && [ "$done_line" -eq 1 ]; } || status=1
  ps -eo args | grep '^minisgl-' | sort | tee -a "$OUT/$name.log"
  start=$(date +%s); kill -TERM $pid; wait $pid; code=$?
  # every process gone within 5 s of the signal (workers and the fork server they came from)
  for _ in $(seq 20); do left=$(pgrep -c '^minisgl-' || true); [ "$left" -eq 0 ] && break; sleep 0.25; done
  pgrep -a '^minisgl-' | tee -a "$OUT/$name.log"
  echo "SIGTERM: exit $code, every process gone after $(( $(date +%s) - start )) s; minisgl processes left: $left" | tee -a "$OUT/$name.log"
  # 0: the server's exit code after an orderly stop on SIGTERM (as on the CPU)
  { [ "$code" -eq 0 ] && [ "$left" -eq 0 ]; } || status=1
}

serve_and_ask() {  # NAME PORT QUESTION SERVE_ARGS...: `serve` on the GPU answers one chat; a scheduler not ready in
  # 90 s prints where each of its threads is (faulthandler on SIGABRT) before it is stopped
  local name=$1 port=$2 question=$3
  shift 3
  PYTHONFAULTHANDLER=1 timeout 200 "${CLI[@]}" -v serve --device cuda --port "$port" "$@" >>"$OUT/$name.log" 2>&1 &
  for _ in $(seq 90); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 1; done
  if curl -sf "localhost:$port/health" >/dev/null; then
    curl -s -m 60 "localhost:$port/v1/chat/completions" -H 'content-type: application/json' \
      -d "{\"messages\": [{\"role\": \"user\", \"content\": \"$question\"}], \"max_tokens\": 16, \"temperature\": 0}" | tee -a "$OUT/$name.log"
  else
    status=1; pkill -ABRT '^minisgl-TP' ; sleep 2
  fi
  pkill -TERM -f "minisgl_app.cli -v serve --device cuda --port $port" ; sleep 3; tail -80 "$OUT/$name.log"
}

for stage in "$@"; do
  echo "=== $stage $(date -u +%H:%M:%S)"
  case $stage in
    setup)
      [ -f $W/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $W/site .whl/*.whl && touch $W/site/.done; }
      for part in .gguf1/part_ab .gguf2/part_aa; do [ -f $part ] && cp $part $W/gguf/; done
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
      python3 -c "import torch, transformers, flashinfer; print('torch', torch.__version__, 'transformers', transformers.__version__, 'flashinfer', flashinfer.__version__)" ;;
    kernels)  # head_dim 128 (Qwen3 shapes) and 64 (the demo model), as the engine builds them
      python3 - <<'EOF' 2>&1 | tee "$OUT/kernels.log"
import time, torch
from concurrent.futures import ThreadPoolExecutor
from minisgl_engine.kernels.flashinfer_kernels import jit_specs
start = time.perf_counter()
# also the CUDA-core decode module, and the attention modules over an FP8 pool (--kv-dtype fp8);
# every module in one pool of builds (one build_kernels call per set would run the sets in turn)
sets = [(torch.bfloat16, 128, None), (torch.bfloat16, 64, None), (torch.bfloat16, 128, torch.float8_e4m3fn)]
specs = {spec.name: spec for dtype, dim, kv in sets for spec in jit_specs(dtype, dim, False, kv)}
missing = [spec for spec in specs.values() if not spec.is_compiled]
with ThreadPoolExecutor(max(1, len(missing))) as pool:
    list(pool.map(lambda spec: spec.build(verbose=False), missing))
print(f"built {len(missing)} of {len(specs)} FlashInfer modules in {time.perf_counter() - start:.0f} s")
if torch.cuda.device_count() > 1:  # tensor parallelism's fused all-reduce + RMSNorm (distributed.py)
    from flashinfer.comm.trtllm_ar import get_trtllm_comm_module
    start = time.perf_counter()
    get_trtllm_comm_module()
    print(f"built FlashInfer's all-reduce fusion module in {time.perf_counter() - start:.0f} s")
EOF
      ;;
    loadcache)  # kernels built by an earlier call (carried as .ficache/fi.tgz.*): no rebuild
      if ls .ficache/fi.tgz.* >/dev/null 2>&1; then
        # one timestamp for every file: touched one after another, a generated source could end up
        # newer than the object built from it, and ninja would rebuild that module at first use
        # (seen: a ~90 s stall at the first sampled token of a run)
        now=$(date +%s)
        cat .ficache/fi.tgz.* | tar -C $W -xzf - && find $W/fi -exec touch -d "@$now" {} + && echo "kernel cache restored"
      fi ;;
    savecache)  # the built kernels, back to the caller in parts of 15 MB (if they are not too big)
      tar -C $W -czf /tmp/fi.tgz fi $([ -d $W/triton ] && echo triton) && ls -la /tmp/fi.tgz
      [ "$(stat -c %s /tmp/fi.tgz)" -lt 47000000 ] && split -b 15M /tmp/fi.tgz "$OUT/fi.tgz." ;;
    profile)  # where a step's time goes (scripts/gpu_profile.py)
      OUT=$OUT python3 scripts/gpu_profile.py 2>&1 | tee "$OUT/profile.log" || status=1 ;;
    quickprofile)
      OUT=$OUT python3 scripts/gpu_profile.py --quick 2>&1 | tee "$OUT/profile.log" || status=1 ;;
    throughputprofile)  # issue 18's open goals: replays at batch 64-256, the offline workload's steps, the 8B's batch-1 step
      OUT=$OUT timeout 400 python3 scripts/gpu_profile.py --throughput 2>&1 | tee "$OUT/throughput_profile.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    offlineprofile)  # goal 2: the offline workload's steps against their floors, each decode attention's K/V bandwidth
      OUT=$OUT timeout 420 python3 scripts/gpu_profile.py --offline 2>&1 | tee "$OUT/offline_profile.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    offlinekernels)  # goal 2: the offline workload's prefill and decode windows kernel by kernel (sampler included)
      OUT=$OUT timeout 300 python3 scripts/gpu_profile.py --offline-kernels 2>&1 | tee "$OUT/offline_kernels.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    prefillhost)  # goal 2: the host side of the offline workload's prefill steps (per-step times, then a cProfile)
      OUT=$OUT timeout 200 python3 scripts/gpu_profile.py --prefill-host-cprofile 2>&1 | tee "$OUT/prefill_host.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    prefillab)  # the prefill steps' per-step times (no profiler) on the committed tree (.old, as for oldnew), then on this one
      for tree in old new; do
        pp=$PWD/.pkgs; [ "$tree" = old ] && pp=$PWD/.old
        PYTHONPATH=$pp:$W/site OUT=$OUT timeout 200 python3 scripts/gpu_profile.py --prefill-host 2>&1 | grep -E "prefill|wall|Error|Traceback" | sed "s/^/[$tree] /" | tee -a "$OUT/prefill_ab.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    samplerab)  # a sampled step's draw at batch 16-256: the Gumbel-max kernel against divide + FlashInfer's sampler
      timeout 120 python3 scripts/gpu_sampler_ab.py 2>&1 | tee "$OUT/sampler_ab.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    gemmsweep)  # the 0.6B shape's four products at 16-256 and 8,192 rows: cuBLAS, cuBLASLt, triton_kernels.matmul's tilings
      timeout 420 python3 scripts/gpu_gemm_sweep.py 2>&1 | tee "$OUT/gemm_sweep.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    decodesweep)  # decode_attention's tilings at batch 1-256 (scripts/gpu_decode_sweep.py), then the offline workload on the Triton
      # decode attention at every batch size with the default tiling and with the sweep's best
      timeout 540 python3 scripts/gpu_decode_sweep.py 2>&1 | tee "$OUT/decode_sweep.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      best=$(sed -n 's/^BEST_OFFLINE //p' "$OUT/decode_sweep.log")
      for tiles in "" ${best:+"$best"}; do
        MINISGL_DECODE_ATTENTION=triton MINISGL_DECODE_TILES=$tiles timeout 150 "${CLI[@]}" bench offline --device cuda --dummy-weights --config qwen3-0.6b 2>&1 \
          | grep -E '^\{"bench"|Traceback|Error' | sed "s/^/[triton tiles ${tiles:-default}] /" | tee -a "$OUT/bench_sweep.log"
      done ;;
    profile8bq)  # the 8B shape's batch-1 step kernel by kernel under each PROFILE_QUANT --quantization (this tree)
      # shellcheck disable=SC2086
      OUT=$OUT timeout 300 python3 scripts/gpu_profile.py --step-8b --quantizations ${PROFILE_QUANT:-none fp8 int4} --sequence 30 2>&1 \
        | grep -v "CUDA graphs:" | tee "$OUT/profile8bq.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    groupab)  # the one-row group kernel: its tests compiled, the engine's group-weight tests, its plans at the 8B shapes,
      # then batch-1 decode of the 8B shape at int4 and int8 on the committed tree (.old, as for oldnew) and on this one
      # (GROUPAB_RUNS: tree:ENV=value:quantization items; ENV may be empty)
      timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_group_kernels.py 2>&1 \
        | grep -E "passed|failed|Error|^E |^FAILED" | tail -30 | tee "$OUT/groupab.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_cuda.py -k "group or int4_checkpoint or quantized_at_load" 2>&1 \
        | grep -E "agreement|top-1|passed|failed|Error" | tee -a "$OUT/groupab.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      timeout 150 python3 scripts/gpu_group_sweep.py --one-row 2>&1 | tee -a "$OUT/groupab.log"
      for run in ${GROUPAB_RUNS:-old::int4 new::int4 new:MINISGL_GROUP_WIDEN=convert:int4 old::int8 new::int8}; do
        IFS=: read -r tree envs quant <<<"$run"
        pp=$PWD/.pkgs; [ "$tree" = old ] && pp=$PWD/.old
        # shellcheck disable=SC2086
        env $envs PYTHONPATH=$pp:$W/site timeout 200 "${CLI[@]}" bench decode --device cuda --dummy-weights --config qwen3-8b \
          --quantization "$quant" --input-len 128 --output-len 128 --repeat 2 2>&1 \
          | grep -E '^\{"bench"|Traceback|Error' | sed "s/^/[$run] /" | tee -a "$OUT/groupab.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    profile8b|profile06b)  # the 8B (0.6B) shape's batch-1 step kernel by kernel, on the committed tree (.old, as for oldnew) then on this one
      for tree in old new; do
        pp=$PWD/.pkgs; [ "$tree" = old ] && pp=$PWD/.old
        PYTHONPATH=$pp:$W/site OUT=$OUT timeout 200 python3 scripts/gpu_profile.py "--step-${stage#profile}" 2>&1 | sed "s/^/[$tree] /" | tee -a "$OUT/$stage.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    attnab)  # a decode step's attention from qkv: the committed q/k + split + merge kernels against the one fused kernel
      python3 scripts/gpu_kernel_ab.py fused_attention 2>&1 | tee "$OUT/attn_ab.log" || status=1 ;;
    diag)  # the first call of each kernel in a fresh process
      python3 scripts/gpu_first_calls.py 2>&1 | tee "$OUT/diag.log" ;;
    kerneltests)  # the Triton kernels compiled, in bf16
      python3 -m pytest tests/gpu/test_triton_kernels.py -q -p no:cacheprovider 2>&1 | tee "$OUT/kerneltests.log" || status=1 ;;
    tests)
      python3 -m pytest tests/gpu/test_triton_kernels.py -q -p no:cacheprovider || status=1
      python3 -m pytest -m cuda tests/gpu/test_cuda.py tests/unit/test_overlap.py -q -s -p no:cacheprovider --durations=10 -o log_cli=true --log-cli-level=INFO 2>&1 | tee "$OUT/tests.log" || status=1 ;;
    demo)
      for part in .gguf1/part_ab .gguf2/part_aa; do [ -f $part ] && cp $part $W/gguf/; done
      if [ ! -f "$MINISGL_CACHE_DIR/models/smollm2-135m-instruct/.complete" ]; then
        cat $W/gguf/part_aa $W/gguf/part_ab > $W/demo.gguf && sha256sum $W/demo.gguf
        python3 -c "
from pathlib import Path
from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import convert_gguf
convert_gguf(Path('$W/demo.gguf'), demo_model_dir(), progress=False)
print('demo model ready at', demo_model_dir())" || status=1
      fi ;;
    serve)
      timeout 300 python3 -m pytest -m cuda tests/gpu/test_cuda.py -k serve -q -s -p no:cacheprovider 2>&1 | tee "$OUT/serve.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    demoserve)  # `serve` of the demo model (its GGUF) on the GPU answers a chat
      : >"$OUT/demoserve.log"; serve_and_ask demoserve 19322 "What is the capital of France?" ;;
    ggufserve)  # a GGUF model folder on the GPU (carry .tiny: `python scripts/gguf_shrink.py DEMO_FOLDER .tiny/model`):
      # first in one process (no fork server), then `serve`; whatever is not done in 60 s prints its threads' stacks
      GGUF_MODEL=${GGUF_MODEL:-.tiny/model}
      timeout 150 python3 -c "
import faulthandler, logging, time
logging.basicConfig(level=logging.INFO)
faulthandler.dump_traceback_later(60, exit=True)
start = time.perf_counter()
from minisgl_engine.llm import LLM
llm = LLM('$GGUF_MODEL', device='cuda')
print(f'in-process engine ready in {time.perf_counter() - start:.1f} s')
print(llm.generate(['The capital of France is'])[0])
" 2>&1 | tee "$OUT/ggufserve.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      serve_and_ask ggufserve 19323 "Hello" --model "$GGUF_MODEL" ;;
    footprint)  # issue 44's figures on the GPU: `serve` of the demo model, host PSS and GPU memory idle and under an 8,000-token chat, ready time, CUDA graphs
      timeout 400 "${CLI[@]}" bench footprint --app serve --app-args "--device cuda" --starts 2 --chat-tokens 8000 --label "$(git log --format=%h -1 2>/dev/null)" 2>&1 | tee "$OUT/footprint.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    fp8weights)  # --quantization fp8: its kernel and agreement tests, then batch-1 decode (FP8_RUNS: config:quantization pairs)
      timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_triton_kernels.py tests/gpu/test_cuda.py -k "fp8_weights or quantized_to_fp8" 2>&1 | tee "$OUT/fp8weights.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      for run in ${FP8_RUNS:-qwen3-8b:none qwen3-8b:fp8 qwen3-0.6b:none qwen3-0.6b:fp8}; do
        timeout 150 "${CLI[@]}" bench decode --device cuda --dummy-weights --config "${run%%:*}" --quantization "${run##*:}" --input-len 128 --output-len 128 --repeat 2 2>&1 | tail -3 | tee -a "$OUT/fp8weights.log"
      done ;;
    prefillprofile)  # a 128-token prefill of the 8B shape under each PREFILL_KINDS quantization: its time and top kernels
      # shellcheck disable=SC2086
      timeout 300 python3 scripts/gpu_prefill_profile.py ${PREFILL_KINDS:-none int4 fp8} 2>&1 | grep -v "CUDA graphs:" | tee "$OUT/prefillprofile.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    groupweights)  # 4- and 8-bit weights on the GPU (GGUF kept quantized, --quantization int4|int8): the kernels'
      # tests compiled and the agreement tests, the one-row kernel's plans at the 8B shapes, then batch-1 decode
      # (GROUP_TESTS: the test files; GROUP_RUNS: config:quantization pairs; GROUP_ARGS: the bench's shape)
      [ -d .tiny/model ] && export MINISGL_GPU_GGUF_MODEL=$PWD/.tiny/model
      # shellcheck disable=SC2086
      timeout 300 python3 -m pytest -q -s -p no:cacheprovider ${GROUP_TESTS:-tests/gpu/test_group_kernels.py tests/gpu/test_cuda.py} -k "group or gguf_stays or quantized_at_load" 2>&1 | tee "$OUT/groupweights.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      [ "${GROUP_SWEEP:-1}" = 1 ] && timeout 240 python3 scripts/gpu_group_sweep.py 2>&1 | tee -a "$OUT/groupweights.log"
      for run in ${GROUP_RUNS:-qwen3-8b:none qwen3-8b:int4 qwen3-8b:int8 qwen3-8b:fp8 qwen3-0.6b:none qwen3-0.6b:int4}; do
        # shellcheck disable=SC2086
        timeout 200 "${CLI[@]}" bench decode --device cuda --dummy-weights --config "${run%%:*}" --quantization "${run##*:}" ${GROUP_ARGS:---input-len 128 --output-len 128 --repeat 2} 2>&1 | grep -E '^ +[0-9]|^\{' | tee -a "$OUT/groupweights.log"
      done ;;
    bench)
      Q=(--device cuda --dummy-weights --config qwen3-0.6b)
      "${CLI[@]}" bench decode "${Q[@]}" --compare-hf --input-len 128 2048 --output-len 128 --repeat 3 2>&1 | tee "$OUT/bench_decode.log"
      "${CLI[@]}" bench offline "${Q[@]}" --compare-hf 2>&1 | tee "$OUT/bench_offline.log" ;;
    quickbench)  # the headline figures without transformers
      Q=(--device cuda --dummy-weights --config qwen3-0.6b)
      "${CLI[@]}" bench decode "${Q[@]}" --input-len 128 2048 --output-len 128 --repeat 3 2>&1 | tee "$OUT/bench_quick.log"
      "${CLI[@]}" bench offline "${Q[@]}" 2>&1 | tee -a "$OUT/bench_quick.log" ;;
    ablations)
      Q=(--device cuda --dummy-weights --config qwen3-0.6b)
      for ablation in "--no-fused-kernels" "--no-overlap" "--cuda-graph-max-bs 0" "--attn torch --cuda-graph-max-bs 0 --no-overlap"; do
        # shellcheck disable=SC2086
        "${CLI[@]}" bench decode "${Q[@]}" --input-len 128 --output-len 128 --repeat 3 $ablation 2>&1 | tail -1 | tee -a "$OUT/bench_ablations.log"
      done ;;
    verify)  # every `cuda` test on whatever GPUs are here (the two-GPU ones where there are two), then a short bench
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      git log --oneline -1 2>/dev/null | tee "$OUT/verify.log"
      nvidia-smi -L | tee -a "$OUT/verify.log"
      # the files that hold `cuda` tests (not all of tests/: the device lacks the packages of the rest), and the Triton kernels
      mapfile -t cuda_files < <(grep -l "pytest.mark.cuda" tests/*/*.py)
      timeout 200 python3 -m pytest tests/gpu/test_triton_kernels.py tests/gpu/test_group_kernels.py -q -p no:cacheprovider 2>&1 | tail -3 | tee -a "$OUT/verify.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      timeout 420 python3 -m pytest -m cuda tests/unit/test_overlap.py "${cuda_files[@]}" -q -s -p no:cacheprovider --durations=10 2>&1 \
        | tee -a "$OUT/verify.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      timeout 120 "${CLI[@]}" bench decode --device cuda --dummy-weights --config qwen3-0.6b --input-len 128 --output-len 64 2>&1 | tee "$OUT/bench_verify.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    tp)  # two GPUs: bf16 agreement of --tp 2 vs --tp 1, then batch-1 decode of an 8B shape
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 300 python3 -m pytest -m cuda tests/gpu/test_cuda_tp.py -q -s -p no:cacheprovider 2>&1 | tee "$OUT/tp_tests.log" || status=1
      tp_bench ;;
    fusedtest)  # kind nvidia-h200-x2: the fused all-reduce + RMSNorm kernel against the separate ops, hidden 4096 and 1024
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 420 python3 -m pytest -m cuda tests/gpu/test_cuda_tp.py -k fused -q -s -p no:cacheprovider 2>&1 | tee "$OUT/fused_test.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    tpbench)  # the batch-1 decode of the 8B shape alone, --tp 1 then 2
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      tp_bench ;;
    tpprofile)  # kind nvidia-h200-x2: where a --tp 2 decode step's time goes, beside --tp 1 (scripts/gpu_profile_tp.py)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      OUT=$OUT timeout 400 python3 scripts/gpu_profile_tp.py 2>&1 | tee "$OUT/tpprofile.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    oneserve)  # `serve` on one GPU (overlap scheduling, CUDA graphs) answers a streamed chat, then SIGTERM ends every process
      serve_check oneserve ;;
    tpserve)  # kind nvidia-h200-x2: `serve --tp 2` answers a streamed chat, then SIGTERM ends every process
      serve_check tpserve --tp 2 ;;
    dpserve)  # kind nvidia-h200-x2: the same with `serve --dp 2` (a replica per GPU)
      serve_check dpserve --dp 2 ;;
    dpbench)  # kind nvidia-h200-x2: nano-vllm's workload with --dp 1 and 2 (qwen3-0.6b), then chat turns routed by prefix vs round-robin
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      Q=(--device cuda --dummy-weights --config qwen3-0.6b)
      for dp in 1 2; do
        timeout 200 "${CLI[@]}" bench offline "${Q[@]}" --dp $dp 2>&1 | tee -a "$OUT/bench_dp.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
      timeout 300 "${CLI[@]}" bench multiturn "${Q[@]}" --dp 2 --conversations 32 --turns 8 --system-len 256 --user-len 256 --reply-len 64 2>&1 \
        | tee -a "$OUT/bench_dp.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    gemvab)  # batch-1 decode of the 0.6B shape: the one-row kernel off, without PDL, with PDL, with the norms fused in (MINISGL_GEMV)
      gemv_ab 0.6b 3 150 off nopdl nonorm on ;;
    gemvab8b)  # the same for the 8B shape (batch 1, one GPU)
      gemv_ab 8b 2 200 off on ;;
    bench8b)  # the 8B shape's batch-1 decode as the engine runs it (and the one-row kernels it chose)
      gemv_ab 8b 2 200 on ;;
    gemvvariants)  # the one-row products of a layer at other tiles / with prefetch / per-tile reduction, cuBLAS, the read-only roof
      timeout 450 python3 scripts/gpu_gemv_ab.py ${GEMV_CONFIGS:-8b 0.6b} 2>&1 | tee "$OUT/gemv_variants.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    decodeab)  # batch-1 decode with the attention of small decode graphs on FlashInfer, then on the Triton kernels (MINISGL_DECODE_ATTENTION)
      # DECODE_RUNS: "SIZE MODE INPUT_LENS..." separated by ';'
      IFS=';' read -ra runs <<<"${DECODE_RUNS:-0.6b flashinfer 128 512 1024 2048;0.6b triton 128 512 1024 2048;0.6b auto 128 2048;8b auto 128 2048}"
      for run in "${runs[@]}"; do
        read -r size mode lens <<<"$run"
        # shellcheck disable=SC2086
        MINISGL_DECODE_ATTENTION=$mode timeout 200 "${CLI[@]}" -v bench decode --device cuda --dummy-weights --config qwen3-$size --input-len $lens --output-len 128 --repeat 2 2>&1 \
          | grep -E '^\{"bench"|one row|residual|Traceback|Error' | sed "s/^/[$size MINISGL_DECODE_ATTENTION=$mode] /" | tee -a "$OUT/decode_ab.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    offlineab)  # nano-vllm's workload (qwen3-0.6b) with each decode attention choice
      for mode in ${OFFLINE_MODES:-flashinfer auto}; do
        MINISGL_DECODE_ATTENTION=$mode timeout 200 "${CLI[@]}" bench offline --device cuda --dummy-weights --config qwen3-0.6b 2>&1 \
          | grep -E '^\{"bench"|Traceback|Error' | sed "s/^/[MINISGL_DECODE_ATTENTION=$mode] /" | tee -a "$OUT/offline_ab.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    kernelab)  # kernel-level A/B: the committed tree's Triton kernels (.old) against this tree's, and the LM head's float32 paths
      timeout 200 python3 scripts/gpu_kernel_ab.py 2>&1 | tee "$OUT/kernel_ab.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    oldnew)  # each headline bench on the committed tree (.old: `git archive HEAD engine app`, renamed as .pkgs names them), then on this one
      IFS=';' read -ra runs <<<"${OLDNEW_RUNS:-qwen3-0.6b decode --input-len 128 2048 --output-len 128 --repeat 3;qwen3-8b decode --input-len 128 --output-len 128 --repeat 2;qwen3-0.6b offline}"
      for run in "${runs[@]}"; do
        read -r config kind rest <<<"$run"
        for tree in old new; do
          pp=$PWD/.pkgs; [ "$tree" = old ] && pp=$PWD/.old
          # shellcheck disable=SC2086
          PYTHONPATH=$pp:$W/site timeout 200 "${CLI[@]}" -v bench "$kind" --device cuda --dummy-weights --config "$config" $rest 2>&1 \
            | grep -E '^\{"bench"|one row|Traceback|Error' | sed "s/^/[$tree] /" | tee -a "$OUT/oldnew.log"
          [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        done
      done ;;
    envab)  # benches under settings of the environment, one process each: ENVAB_RUNS="VAR=a VAR2=b :: config kind args;..."
      IFS=';' read -ra runs <<<"${ENVAB_RUNS:?set ENVAB_RUNS}"
      for run in "${runs[@]}"; do
        envs=$(echo ${run%%::*}); read -r config kind rest <<<"${run#*::}"
        # shellcheck disable=SC2086
        env $envs timeout 200 "${CLI[@]}" -v bench "$kind" --device cuda --dummy-weights --config "$config" $rest 2>&1 \
          | grep -E '^\{"bench"|Traceback|Error' | sed "s/^/[${envs:-default}] /" | tee -a "$OUT/envab.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    benchdecode)  # the headline batch-1 figures beside transformers (the decode half of stage bench)
      timeout 240 "${CLI[@]}" bench decode --device cuda --dummy-weights --config qwen3-0.6b --compare-hf --input-len 128 2048 4096 --output-len 128 --repeat 2 2>&1 \
        | tee "$OUT/bench_decode.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    demobench)  # the real demo model (SmolLM2-135M-Instruct, bf16) beside transformers (stage demo first)
      timeout 300 "${CLI[@]}" bench decode --device cuda --compare-hf --input-len 128 2048 --output-len 128 --repeat 3 2>&1 | tee "$OUT/bench_demo.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    fp8)  # --kv-dtype fp8: the Triton kernels over an FP8 pool, its agreement test, then nano-vllm's workload and
      # batch-1 decode with the bf16 pool and the FP8 one
      timeout 120 python3 -m pytest tests/gpu/test_triton_kernels.py -q -p no:cacheprovider -k "fp8 or kv_dtype" 2>&1 | tail -3 | tee "$OUT/fp8.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      timeout 300 python3 -m pytest -m cuda tests/gpu/test_cuda.py -k fp8 -q -s -p no:cacheprovider 2>&1 | grep -E "agreement|passed|failed|Error|error" | tee -a "$OUT/fp8.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    fp8bench)  # FP8_DECODE=0: the offline workload alone (a fresh machine compiles Triton's kernels in its first run: ~3 min)
      for kv in ${FP8_KV:-auto fp8}; do
        timeout 250 "${CLI[@]}" bench offline --device cuda --dummy-weights --config qwen3-0.6b --kv-dtype $kv 2>&1 \
          | grep -E '^\{"bench"|Traceback|Error' | sed "s/^/[kv $kv] /" | tee -a "$OUT/bench_fp8.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        [ "${FP8_DECODE:-1}" = 0 ] && continue
        timeout 150 "${CLI[@]}" bench decode --device cuda --dummy-weights --config qwen3-0.6b --kv-dtype $kv --input-len 128 2048 --output-len 128 --repeat 2 2>&1 \
          | grep -E '^\{"bench"|Traceback|Error' | sed "s/^/[kv $kv] /" | tee -a "$OUT/bench_fp8.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    fp8ab)  # the offline workload over an FP8 pool with each decode attention choice (one process each; FP8AB_RUNS:
      # "ENV=... :: FLAGS" separated by ';'), after the bf16 pool and the FP8 one as they are by default
      IFS=';' read -ra runs <<<"${FP8AB_RUNS:-:: --kv-dtype auto;:: --kv-dtype fp8;MINISGL_DECODE_TENSOR_CORES=on :: --kv-dtype fp8;MINISGL_DECODE_ATTENTION=triton :: --kv-dtype fp8;MINISGL_DECODE_ATTENTION=triton :: --kv-dtype auto;:: --kv-dtype fp8 --page-size 16}"
      for run in "${runs[@]}"; do
        envs=$(echo ${run%%::*}); flags=${run#*::}
        # shellcheck disable=SC2086
        env $envs timeout 200 "${CLI[@]}" bench offline --device cuda --dummy-weights --config qwen3-0.6b $flags 2>&1 \
          | grep -E '^\{"bench"|Traceback|Error' | sed "s/^/[${envs:-default}$flags] /" | tee -a "$OUT/bench_fp8ab.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
grep -h '^{"bench"' "$OUT"/bench_*.log 2>/dev/null > "$OUT/bench.jsonl" || true
exit $status
