#!/usr/bin/env bash
# vLLM 0.25 on the device machine, served as compose.yaml writes it on one GPU, calibrated by turnout,
# and its sleep and wake timed (issue #63). After ../shared/gpu/VLLM-ON-H200.md, the recipe that served
# it here first. docs/calibrate.md, "vLLM on the GPU", has the results and the commands.
#
#   bash ../shared/gpu/stage-vllm-0.25.sh ../.library/device/KINDS.md   # here, once: .vgpu/site.tar.xz
#   bash bench/gpu/vllm.sh split        # here, once: .vgpu/part0.. (36 MB each), .gpu/wheels (turnout's)
#   device run, carry [".vgpu/part0"]: bash bench/gpu/vllm.sh part:0      # one part a call, back to back
#   ... part:1, part:2 ...; the last part's call carries .gpu/wheels too and goes on:
#   device run: bash bench/gpu/vllm.sh part:3 unpack model:weights serve:compose     # ~6 min
#   device run: bash bench/gpu/vllm.sh calibrate:65536:200s switch:reload stop       # ~6 min
#   device run: bash bench/gpu/vllm.sh switch:reload turns                            # ~5 min
#   device run: bash bench/gpu/vllm.sh serve:fp8 calibrate:65536:150s turns stop      # ~9 min
#
# Stages run in the order given. A warm machine keeps /tmp/vgpu (the parts, vLLM's site-packages), the
# model in /dev/shm and the server between calls; results go to $OUT (brought back by the device tool).
#   split             here: .vgpu/site.tar.xz into .vgpu/partN (one carried a call, under 64 MiB with
#                     the repository) and turnout's runtime wheels into .gpu/wheels
#   part:N            copy the carried .vgpu/partN to /tmp/vgpu
#   unpack            join the parts, unpack vLLM's site-packages, install turnout's wheels (/tmp/site)
#   model[:weights]   the 27B-shape model folder in $MODEL (bench/gpu/vllm_model.py); with :weights,
#                     random bf16 safetensors (~54 GB) so that a level-2 wake can reload them. $MODEL
#                     is on the disk ($HOME/q27): with the weights in /dev/shm (54 GB of tmpfs) beside
#                     the ~50 GiB a level-1 sleep pins, the first sleep did not answer in 8 minutes
#   serve:FLAGSET     vLLM until /health is 200: compose (compose.yaml's flags, one GPU), fp8 (the
#                     same, weights quantised to fp8 as they load: Q8_0's partner of equal bytes) or
#                     recipe (the recipe's command: bf16 KV, 8k batched tokens)
#   calibrate:WINDOW:BUDGET   turnout calibrate -> $OUT/<card>-vllm-27b-shape[-fp8].toml (h100 or h200)
#   turns             agent sessions (4 turns growing by 300, 1,500 and 5,000 words) and fresh prompts
#                     (1k-60k) through turnout with the flag set's profile (this run's calibration, or
#                     the built-in one): predicted TTFT and time to the last token against measured
#                     (bench/gpu/turns.py) -> $OUT/turns-vllm-FLAGSET.json, and the server's
#                     /metrics after them -> $OUT/metrics-vllm-FLAGSET.txt
#   warm              one request (2,000 words, 16 tokens) so that the server's slow first answer
#                     is not among the measured ones
#   switch[:reload]   sleep and wake at levels 1 and 2, the prefix cache across them, decode at 1, 4
#                     and 16 streams (bench/gpu/vllm_switch.py) -> $OUT/switch.json
#   stop              stop the server
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
WORK=/tmp/vgpu
MODEL=${MODEL:-$HOME/q27}
PORT=${PORT:-8000}
PIDFILE=/tmp/turnout-vllm.pid
PART_BYTES=36100000
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

say() { echo "[$(date +%H:%M:%S)] $*"; }

stage_split() {
  [ -s .vgpu/site.tar.xz ] || { echo "no .vgpu/site.tar.xz: run ../shared/gpu/stage-vllm-0.25.sh first" >&2; exit 2; }
  rm -f .vgpu/part*
  split -b "$PART_BYTES" -d -a 1 .vgpu/site.tar.xz .vgpu/part
  mkdir -p .gpu
  python3 - <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from pack import pack_wheels
print(pack_wheels())
PY
  ls -la .vgpu/part* && du -sh .gpu/wheels
}

stage_part() {
  mkdir -p "$WORK"
  cp ".vgpu/part$1" "$WORK/"
  say "part $1: $(du -h "$WORK/part$1" | cut -f1); in $WORK: $(ls "$WORK" | tr '\n' ' ')"
}

stage_unpack() {
  if [ ! -d "$WORK/site" ]; then
    local started=$SECONDS
    cat "$WORK"/part* | xz -d -T0 | tar -x -C "$WORK"
    say "unpack: vLLM's site-packages in $((SECONDS - started)) s"
  fi
  if [ ! -d /tmp/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/wheels/*.whl
  fi
  PYTHONPATH=$WORK/site python3 -c "import vllm, xgrammar; print('vllm', vllm.__version__)"
}

stage_model() {
  mkdir -p "$MODEL"
  local free_gb
  free_gb=$(df -BG --output=avail "$MODEL" | tail -1 | tr -dc 0-9)
  if [ "${1:-}" = weights ] && [ ! -s "$MODEL/model.safetensors.index.json" ] && [ "$free_gb" -lt 56 ]; then
    say "model: only $free_gb GB free under $MODEL, the weights need 54: dummy weights (no level-2 reload)"
    set -- ""
  fi
  if [ "${1:-}" = weights ] && [ ! -s "$MODEL/model.safetensors.index.json" ]; then
    python3 bench/gpu/vllm_model.py "$MODEL" --weights 2>&1 | tee "$OUT/model.log"
  elif [ ! -s "$MODEL/config.json" ]; then
    python3 bench/gpu/vllm_model.py "$MODEL" 2>&1 | tee "$OUT/model.log"
  fi
  df -h "$MODEL" /dev/shm | tail -2
}

flags_for() {
  local load=()
  [ -s "$MODEL/model.safetensors.index.json" ] || load=(--set load-format=dummy)
  local own=(--service vllm --model "$MODEL" --port "$PORT" --one-gpu "${load[@]}"
    --set max-model-len=65536 --set max-num-seqs=16 --set enable-sleep-mode --set gdn-prefill-backend=triton)
  case "$1" in
    compose) python3 bench/gpu/compose_flags.py "${own[@]}" ;;
    fp8) python3 bench/gpu/compose_flags.py "${own[@]}" --set quantization=fp8 ;;
    recipe) python3 bench/gpu/compose_flags.py "${own[@]}" --set gpu-memory-utilization=0.85 \
      --set kv-cache-dtype=auto --set max-num-batched-tokens=8192 ;;
    *) echo "unknown flag set $1" >&2; exit 2 ;;
  esac
}

stop_server() {
  if [ -f "$PIDFILE" ]; then kill -- "-$(cat "$PIDFILE")" 2>/dev/null || true; sleep 5; rm -f "$PIDFILE"; fi
}

stage_serve() {
  stop_server
  mapfile -t flags < <(flags_for "$1")
  echo "${flags[*]}" | tee "$OUT/vllm-flags-$1.txt" > "$WORK/flags.txt"  # $OUT is new each call
  echo "$1" > "$WORK/flagset"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$OUT/vllm-gpu-memory-$1.txt"
  local started=$SECONDS log="$OUT/vllm-server-$1.log"
  VLLM_SERVER_DEV_MODE=1 PYTHONPATH=$WORK/site setsid python3 -m vllm.entrypoints.openai.api_server \
    "${flags[@]}" > "$log" 2>&1 &
  echo $! > "$PIDFILE"
  until curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; do
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { tail -40 "$log"; exit 1; }
    [ $((SECONDS - started)) -lt "${SERVE_WAIT:-540}" ] || { say "serve $1: not healthy after $((SECONDS - started)) s (still starting)"; return; }
    sleep 2
  done
  say "serve $1: healthy after $((SECONDS - started)) s"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv | tee -a "$OUT/vllm-gpu-memory-$1.txt"
  grep -iE "block_size|block size|mamba|prefix|KV cache|max_num_seqs|Available" "$log" | tail -20 || true
}

wait_healthy() {
  until curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; do
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { echo "the server died" >&2; exit 1; }
    sleep 2
  done
}

card_tag() {
  local tag
  tag=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | head -1 | tr 'A-Z' 'a-z')
  echo "${tag:-gpu}"
}

# the serving flag set's profile name: compose's is the plain one, others are suffixed
profile_name() {
  local set
  set=$(cat "$WORK/flagset" 2>/dev/null || echo compose)
  if [ "$set" = compose ]; then echo "$(card_tag)-vllm-27b-shape"; else echo "$(card_tag)-vllm-27b-shape-$set"; fi
}

stage_calibrate() {
  wait_healthy
  local card name weights=bf16
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  name=$(profile_name)
  grep -q "quantization fp8" "$WORK/flags.txt" && weights="bf16 checkpoint, quantised to fp8 as it loads"
  PYTHONPATH=/tmp/site:$PWD python3 -c "from gateway.cli import main; raise SystemExit(main())" calibrate \
    "http://127.0.0.1:$PORT" --out "$OUT/$name.toml" --name "$name" \
    --budget "$2" --window "$1" --batch 2048 \
    --machine gpu="1x $card" --machine cpu="$(nproc) cores, $(free -g | awk '/^Mem/ {print $2}') GiB RAM" \
    --machine model="random-weight Qwen3.5-27B shape (bench/gpu/vllm_model.py), $weights, vLLM 0.25.0" \
    --machine flags="$(cat "$WORK/flags.txt")" 2>&1 | tee "$OUT/calibrate-$name.log"
  cp "$OUT/$name.toml" "$WORK/$name.toml"  # for later calls' turns: $OUT starts empty each call
}

stage_turns() {
  wait_healthy
  local name profile
  name=$(profile_name)
  profile=$WORK/$name.toml
  [ -s "$profile" ] || profile=backends/profiles/$name.toml
  say "turns: profile $profile"
  PYTHONPATH=/tmp/site:$PWD python3 bench/gpu/turns.py --engine "http://127.0.0.1:$PORT" --kind vllm \
    --model qwen3.8-27b --profile "$profile" --turns "${TURNS:-4}" --first "${FIRST_WORDS:-2000}" \
    --grow ${GROW:-300 1500 5000} --fresh ${FRESH:-1024 4096 16384 32768 60000} \
    --max-tokens "${MAX_TOKENS:-128}" --out "$OUT/turns-vllm-$(cat "$WORK/flagset").json" 2>&1 \
    | grep -v '^\S* \S* \[info' | tee "$OUT/turns-vllm-$(cat "$WORK/flagset").log"
  curl -fsS "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics-vllm-$(cat "$WORK/flagset").txt" || true
}

stage_warm() {
  wait_healthy
  local started=$SECONDS
  python3 -c 'import json; print(json.dumps({"model": "qwen3.8-27b", "max_tokens": 16,
    "messages": [{"role": "user", "content": " ".join(["warm"] * 2000)}]}))' \
    | curl -fsS "http://127.0.0.1:$PORT/v1/chat/completions" -H 'content-type: application/json' -d @- > /dev/null
  say "warm: the first request answered in $((SECONDS - started)) s"
}

stage_switch() {
  wait_healthy
  local reload=()
  # the dummy loader cannot reload: only with real weights
  [ "${1:-}" = reload ] && [ -s "$MODEL/model.safetensors.index.json" ] && reload=(--reload)
  PYTHONPATH=/tmp/site python3 bench/gpu/vllm_switch.py "http://127.0.0.1:$PORT" --out "$OUT/switch.json" \
    "${reload[@]}" 2>&1 | tee "$OUT/switch.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU here"
for step in "$@"; do
  IFS=: read -r name a b <<< "$step"
  say "== $step"
  case "$name" in
    split) stage_split ;;
    part) stage_part "$a" ;;
    unpack) stage_unpack ;;
    model) stage_model "${a:-}" ;;
    serve) stage_serve "$a" ;;
    calibrate) stage_calibrate "$a" "$b" ;;
    switch) stage_switch "${a:-}" ;;
    turns) stage_turns ;;
    warm) stage_warm ;;
    stop) stop_server ;;
    *) echo "unknown stage $name" >&2; exit 2 ;;
  esac
done
