"""vLLM and llama-server sharing one GPU in turn, switched by ``turnout serve`` (issue #62 item 5).

    python3 bench/gpu/residency_switch.py --vllm http://127.0.0.1:8000 --server BIN \
        --models-dir /dev/shm/q27 --router-model q27-q4_0 --flags-file FLAGS --out residency-switch.json

On a GPU where vLLM (``--enable-sleep-mode``, ``VLLM_SERVER_DEV_MODE=1``, bf16 KV) holds most of the
memory, this starts llama-server in router mode (``--models-max 1 --no-models-autoload
--slot-save-path``, the flags of ``FLAGS`` less its ``--model``) and ``turnout serve`` in this process
with one model served by both engines and one ``[[residency]]`` set of the two, vLLM awake. Then one
agent session (``x-session-id``) goes on through three switches made from the admin API:

1. vLLM -> llama-server while another session's long answer streams from vLLM (the drain must wait
   for it, not cut it) and the agent's next turn arrives in the middle (it must wait, then be served);
2. llama-server -> vLLM the same way (the agent's slot saved before the unload);
3. vLLM -> llama-server with nothing in flight: the agent's next turn finds its slot restored.

GPU memory is sampled every ~0.25 s throughout (nvidia-smi). Writes every request (status, backend,
TTFT, time to the last token, tokens, cached tokens, the residency wait turnout reported), every switch
(its steps' seconds, as the admin API tells them) and the memory timeline to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from router import router_flags, start_router  # noqa: E402  (bench/gpu/router.py)
from turns import VOCABULARY  # noqa: E402

from gateway.app import create_app  # noqa: E402  (after the path is set)
from gateway.serving import ServerThread  # noqa: E402
from gateway.settings import load_settings  # noqa: E402

TOKEN = "gpu-run-admin"
EXPECTED_REQUESTS = 9
"""Seven agent turns and two long answers: every one must be recorded."""
ADMIN = {"authorization": f"Bearer {TOKEN}"}
T0 = time.perf_counter()


def now() -> float:
    return round(time.perf_counter() - T0, 3)


class Memory(threading.Thread):
    """The GPU's memory in use, sampled until stopped: [(seconds since start, MiB)]."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set() and shutil.which("nvidia-smi"):
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, check=False).stdout.split()  # fmt: skip
            if out:
                self.samples.append((now(), int(out[0])))
            self.halt.wait(0.25)

    def at(self, t: float) -> int | None:
        """The last sample taken at or before ``t``."""
        before = [m for s, m in self.samples if s <= t]
        return before[-1] if before else None


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(n))


def stream(client: httpx.Client, label: str, session: str, messages: list[dict[str, str]], max_tokens: int,
           first: threading.Event | None = None) -> dict[str, Any]:  # fmt: skip
    """One streamed chat request through turnout; what the client saw of it."""
    body = {"model": "m", "messages": messages, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream_options": {"include_usage": True}}  # fmt: skip
    row: dict[str, Any] = {"label": label, "session": session, "sent_at": now()}
    started = time.perf_counter()
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"x-session-id": session}) as r:
        row["status"] = r.status_code
        row["backend"] = r.headers.get("x-turnout-backend")
        row["residency_wait_s"] = r.headers.get("x-turnout-residency-wait")
        if r.status_code != 200:
            row["error"] = r.read().decode(errors="replace")[:500]
            return row
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or ""  # what a client sends back as the assistant's turn
                output = piece or delta.get("reasoning_content") or delta.get("reasoning")
                if "ttft_s" not in row:  # the first event of the answer (a random model's text may be empty)
                    row["ttft_s"] = round(time.perf_counter() - started, 3)
                    if first is not None:
                        first.set()
                if output or choice.get("finish_reason"):
                    row["last_s"] = round(time.perf_counter() - started, 3)
                row["finish_reason"] = choice.get("finish_reason") or row.get("finish_reason")
                pieces.append(piece)
            usage = chunk.get("usage") or usage
    row["prompt_tokens"] = usage.get("prompt_tokens")
    row["completion_tokens"] = usage.get("completion_tokens")
    row["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    row["answer"] = "".join(pieces) or "ok"
    return row


def residency(client: httpx.Client) -> dict[str, Any]:
    return dict(client.get("/admin/api/residency", headers=ADMIN).json()["data"][0])


def switch(client: httpx.Client, target: str, limit_s: float) -> dict[str, Any]:
    """Ask for ``target`` awake; wait for the switch to end; its record (the admin API's)."""
    asked_at = now()
    asked = client.post("/admin/api/residency/gpu", json={"wake": target}, headers=ADMIN)
    if asked.status_code != 202:
        raise SystemExit(f"switch to {target}: {asked.status_code} {asked.text[:300]}")
    print(f"[{now():8.2f}] switch to {target} asked", flush=True)
    deadline = time.monotonic() + limit_s
    while (state := residency(client))["switch"] is not None:
        if time.monotonic() > deadline:
            raise SystemExit(f"switch to {target}: not done after {limit_s} s: {state}")
        time.sleep(0.1)
    record = dict(state["history"][0])
    record.update(asked_at=asked_at, ended_at=now())
    print(f"[{now():8.2f}] switch {record['from']} -> {record['to']}: {record['result']} "
          f"{record['steps_s']} {record.get('error') or ''}", flush=True)  # fmt: skip
    return record


class Agent:
    """The session that lives through the switches: each turn its answer and more words."""

    def __init__(self, client: httpx.Client, seed: str, first: int, grow: int, answer: int) -> None:
        self.client, self.grow, self.answer = client, grow, answer
        self.rng = random.Random(f"{seed}-agent")
        self.messages = [{"role": "system", "content": "You are a coding agent."},
                         {"role": "user", "content": words(self.rng, first)}]  # fmt: skip
        self.session = f"agent-{seed}"
        self.turns = 0

    def turn(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        self.turns += 1
        row = stream(self.client, f"agent turn {self.turns}", self.session, self.messages, self.answer)
        answer = row.get("answer")
        keep(rows, row)
        if answer is not None:
            self.messages += [{"role": "assistant", "content": answer},
                              {"role": "user", "content": words(self.rng, self.grow)}]  # fmt: skip
        return row


def keep(rows: list[dict[str, Any]], row: dict[str, Any]) -> None:
    row.pop("answer", None)
    rows.append(row)
    print(f"[{now():8.2f}] {json.dumps(row)}", flush=True)


def under_load(client: httpx.Client, agent: Agent, target: str, rows: list[dict[str, Any]],
               args: argparse.Namespace, seed: str) -> dict[str, Any]:  # fmt: skip
    """A switch asked while another session's long answer streams, with the agent's next turn sent a
    second after the ask: the stream must end whole, the turn must wait and then be served."""
    first = threading.Event()
    long_rng = random.Random(f"{seed}-long-{target}")
    long_messages = [{"role": "user", "content": words(long_rng, 500)}]
    got: dict[str, Any] = {}
    label = f"long answer before the switch to {target}"

    def long_answer() -> None:
        try:
            got.update(stream(client, label, f"long-{seed}-{target}", long_messages, args.long_tokens, first))
        except Exception as exc:  # a broken stream is a result: recorded, not lost with the thread
            got.update(label=label, status=f"error: {exc!r}")
            first.set()

    def next_turn() -> None:
        time.sleep(1.0)
        try:
            agent.turn(rows)
        except Exception as exc:
            keep(rows, {"label": f"agent turn {agent.turns}", "status": f"error: {exc!r}"})

    streaming = threading.Thread(target=long_answer)
    streaming.start()
    if not first.wait(120):
        raise SystemExit(f"the long answer before the switch to {target} never started: {got}")
    turn = threading.Thread(target=next_turn)
    record: dict[str, Any] = {}
    asking = threading.Thread(target=lambda: record.update(switch(client, target, args.limit)))
    asking.start()
    turn.start()
    for thread in (asking, turn, streaming):
        thread.join()
    keep(rows, got)
    record["long_answer_whole"] = got.get("completion_tokens") == args.long_tokens
    return record


def config(args: argparse.Namespace, router_url: str) -> dict[str, Any]:
    timeouts = {"read": 1800.0, "first_byte": 1800.0, "probe": 10.0}
    return {
        "host": "127.0.0.1",
        "port": 0,
        "admin": {"token": TOKEN},
        "backends": [
            {"id": "vllm", "kind": "vllm", "url": args.vllm, "engine_profile": args.vllm_profile,
             "probe_interval_s": 0.5, "timeouts": timeouts},
            {"id": "llama", "kind": "llamacpp", "url": router_url, "engine_profile": args.llama_profile,
             "probe_interval_s": 0.5, "timeouts": timeouts},
        ],
        "models": [{"name": "m", "architecture": "hybrid", "deployments": [
            {"backend": "vllm", "upstream_name": args.vllm_model},
            {"backend": "llama", "upstream_name": args.router_model}]}],
        "residency": [{"name": "gpu", "awake": "vllm", "wait_s": args.limit, "drain_s": args.limit,
                       "step_timeout_s": args.limit, "members": [
                           {"backend": "vllm", "sleep_level": 1},
                           {"backend": "llama", "router_model": args.router_model}]}],
    }  # fmt: skip


def start_router_for(args: argparse.Namespace, slots: Path) -> subprocess.Popen[bytes]:
    flags = router_flags(args.flags_file.read_text().split())
    log = args.log.open("wb")
    return start_router(args.server, args.models_dir, flags, args.port, log, "--slot-save-path", str(slots))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm", required=True, help="vLLM's URL (started with --enable-sleep-mode)")
    parser.add_argument("--vllm-model", default="qwen3.8-27b", help="vLLM's --served-model-name")
    parser.add_argument("--vllm-profile", default="h100-vllm-27b-shape")
    parser.add_argument("--llama-profile", default="h100-llamacpp-27b-shape-q4_0-dense")
    parser.add_argument("--server", required=True, help="the llama-server binary")
    parser.add_argument("--models-dir", required=True, type=Path)
    parser.add_argument("--router-model", required=True, help="the GGUF's stem: the router's model id")
    parser.add_argument("--flags-file", required=True, type=Path)
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--first", type=int, default=2000, help="words of the agent's first prompt")
    parser.add_argument("--grow", type=int, default=300, help="words each turn adds")
    parser.add_argument("--answer", type=int, default=64, help="tokens of each agent answer")
    parser.add_argument("--long-tokens", type=int, default=768, help="tokens of the answer in flight")
    parser.add_argument("--limit", type=float, default=240.0, help="seconds a switch or a wait may take")
    parser.add_argument("--log", type=Path, default=Path("residency-router.log"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    seed = str(random.SystemRandom().randrange(1 << 31))
    memory = Memory()
    memory.start()
    slots = Path(tempfile.mkdtemp(prefix="slots-"))
    router = start_router_for(args, slots)
    rows: list[dict[str, Any]] = []
    switches: list[dict[str, Any]] = []
    result: dict[str, Any] = {"config": config(args, f"http://127.0.0.1:{args.port}")}
    gateway: ServerThread | None = None
    try:
        gateway = ServerThread(create_app(load_settings(None, **result["config"]))).start()
        with httpx.Client(base_url=gateway.url, timeout=args.limit * 2) as client:
            deadline = time.monotonic() + args.limit
            while client.get("/health").json().get("backends", {}).get("vllm") != "ready":
                if time.monotonic() > deadline:
                    raise SystemExit(f"vLLM not ready through turnout: {client.get('/health').text}")
                time.sleep(0.5)
            result["start"] = {"at": now(), "residency": residency(client)}
            agent = Agent(client, seed, args.first, args.grow, args.answer)
            agent.turn(rows)
            agent.turn(rows)
            switches.append(under_load(client, agent, "llama", rows, args, seed))
            agent.turn(rows)
            switches.append(under_load(client, agent, "vllm", rows, args, seed))
            agent.turn(rows)
            switches.append(switch(client, "llama", args.limit))
            agent.turn(rows)
            result["end"] = {"at": now(), "residency": residency(client),
                             "metrics": [line for line in client.get("/metrics").text.splitlines()
                                         if line.startswith("turnout_residency")]}  # fmt: skip
    finally:
        if gateway is not None:
            gateway.stop()
        router.terminate()
        router.wait(30)
        memory.halt.set()
        memory.join(5)
        for record in switches:  # the GPU's memory before the ask, at its lowest during, and after
            during = [m for t, m in memory.samples if record["asked_at"] <= t <= record["ended_at"]]
            record["gpu_mib"] = {"before": memory.at(record["asked_at"]), "lowest": min(during, default=None),
                                 "after": memory.at(record["ended_at"] + 0.5)}  # fmt: skip
        result.update(requests=rows, switches=switches, gpu_memory_mib=memory.samples,
                      saved_slots=sorted(p.name for p in slots.iterdir()))  # fmt: skip
        args.out.write_text(json.dumps(result, indent=1))
    failed = [r for r in rows if r.get("status") != 200]
    if len(rows) != EXPECTED_REQUESTS:
        print(f"expected {EXPECTED_REQUESTS} requests, recorded {len(rows)}")
        return 1
    cut = [s for s in switches if s.get("long_answer_whole") is False]
    made = [(s["from"], s["to"], s["result"], s["total_s"]) for s in switches]
    print(f"requests: {len(rows)}, failed {len(failed)}; switches: {made}; long answers cut: {len(cut)}")
    return 1 if failed or cut or any(s["result"] != "done" for s in switches) else 0


if __name__ == "__main__":
    raise SystemExit(main())
