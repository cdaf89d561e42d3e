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
#
# Stages run in the order given. A warm machine keeps /tmp/vgpu (the parts, vLLM's site-packages), the
# model in /dev/shm and the server between calls; results go to $OUT (brought back by the device tool).
#   split             here: .vgpu/site.tar.xz into .vgpu/partN (one carried a call, under 64 MiB with
#                     the repository) and turnout's runtime wheels into .gpu/wheels
#   part:N            copy the carried .vgpu/partN to /tmp/vgpu
#   unpack            join the parts, unpack vLLM's site-packages, install turnout's wheels (/tmp/site)
#   model[:weights]   the 27B-shape model folder in $MODEL (bench/gpu/vllm_model.py); with :weights,
#                     random bf16 safetensors (~54 GB) so that a level-2 wake can reload them. On
#                     2026-12-06 (H100) the first level-1 sleep with those weights in /dev/shm did not
#                     answer in 8 minutes (54 GB in tmpfs + 50 GiB of pinned offload on 125 GiB):
#                     next time MODEL=$HOME/q27 (the disk has 64 GiB free), or dummy weights for level 1
#   serve:FLAGSET     vLLM until /health is 200: compose (compose.yaml's flags, one GPU) or recipe
#                     (the recipe's command: bf16 KV, 8k batched tokens)
#   calibrate:WINDOW:BUDGET   turnout calibrate -> $OUT/<card>-vllm-27b-shape.toml (h100 or h200)
#   switch[:reload]   sleep and wake at levels 1 and 2, the prefix cache across them, decode at 1, 4
#                     and 16 streams (bench/gpu/vllm_switch.py) -> $OUT/switch.json
#   stop              stop the server
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
WORK=/tmp/vgpu
MODEL=${MODEL:-/dev/shm/q27}
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
  if [ "${1:-}" = weights ] && [ ! -s "$MODEL/model.safetensors.index.json" ]; then
    python3 bench/gpu/vllm_model.py "$MODEL" --weights 2>&1 | tee "$OUT/model.log"
  elif [ ! -s "$MODEL/config.json" ]; then
    python3 bench/gpu/vllm_model.py "$MODEL" 2>&1 | tee "$OUT/model.log"
  fi
  df -h /dev/shm | tail -1
}

flags_for() {
  local load=()
  [ -s "$MODEL/model.safetensors.index.json" ] || load=(--set load-format=dummy)
  local own=(--service vllm --model "$MODEL" --port "$PORT" --one-gpu "${load[@]}"
    --set max-model-len=65536 --set max-num-seqs=16 --set enable-sleep-mode --set gdn-prefill-backend=triton)
  case "$1" in
    compose) python3 bench/gpu/compose_flags.py "${own[@]}" ;;
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
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$OUT/vllm-gpu-memory-$1.txt"
  local started=$SECONDS log="$OUT/vllm-server-$1.log"
  VLLM_SERVER_DEV_MODE=1 PYTHONPATH=$WORK/site setsid python3 -m vllm.entrypoints.openai.api_server \
    "${flags[@]}" > "$log" 2>&1 &
  echo $! > "$PIDFILE"
  until curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; do
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { tail -40 "$log"; exit 1; }
    [ $((SECONDS - started)) -lt 540 ] || { say "serve $1: not healthy after 540 s (still starting)"; return; }
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

stage_calibrate() {
  wait_healthy
  local card tag
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  tag=$(echo "$card" | grep -oiE 'h100|h200' | head -1 | tr 'A-Z' 'a-z'); tag=${tag:-gpu}
  PYTHONPATH=/tmp/site:$PWD python3 -c "from gateway.cli import main; raise SystemExit(main())" calibrate \
    "http://127.0.0.1:$PORT" --out "$OUT/$tag-vllm-27b-shape.toml" --name "$tag-vllm-27b-shape" \
    --budget "$2" --window "$1" --batch 2048 \
    --machine gpu="1x $card" --machine cpu="$(nproc) cores, $(free -g | awk '/^Mem/ {print $2}') GiB RAM" \
    --machine model="random-weight Qwen3.5-27B shape (bench/gpu/vllm_model.py), bf16, vLLM 0.25.0" \
    --machine flags="$(cat "$WORK/flags.txt")" 2>&1 | tee "$OUT/calibrate-vllm.log"
}

stage_switch() {
  wait_healthy
  local reload=()
  [ "${1:-}" = reload ] && reload=(--reload)
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
    stop) stop_server ;;
    *) echo "unknown stage $name" >&2; exit 2 ;;
  esac
done
