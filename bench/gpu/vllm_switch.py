"""vLLM's sleep and wake, its prefix cache across them, and its decode per stream (issue #63), measured.

    python3 bench/gpu/vllm_switch.py http://127.0.0.1:8000 --out switch.json [--reload] [--streams 1,4,16]

On a vLLM started with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1`` (the dev endpoints
``/sleep``, ``/wake_up``, ``/is_sleeping``, ``/collective_rpc``), one step at a time, with the GPU's
memory in use (nvidia-smi) before and after each:

1. the prefix cache: a fresh prompt, then the same prompt (cached tokens as vLLM reports them);
2. level 1 twice (the first sleep offloads the weights to pinned RAM; the second reuses it), each
   followed by a wake and the same prompt again (is anything still cached?);
3. level 2: sleep (weights dropped), wake the weights, ``reload_weights`` from the checkpoint
   (``--reload``: the server must have been started from real safetensors), wake the KV cache, then a
   prompt to show it answers;
4. decode: ``--streams`` concurrent streams of ``--decode-tokens`` tokens each (``ignore_eos``); the
   rate per stream from the gaps between each stream's first and last token.

Every timing is the HTTP call's own (``/sleep`` and ``/wake_up`` answer when the engine is done).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

STEP_TIMEOUT_S = 240.0
"""A sleep or wake that takes longer is reported as such (a first level-1 sleep took 28 s here)."""
WORD_IDS = range(1000, 1040)  # the model folder's words (bench/gpu/vllm_model.py): any ids would do


def gpu_memory_mib() -> int | None:
    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return int(text.split()[0])


class Probe:
    def __init__(self, url: str, model: str, seed: int) -> None:
        self.client = httpx.Client(base_url=url, timeout=STEP_TIMEOUT_S)
        self.model = model
        self.rng = random.Random(seed)
        self.steps: list[dict[str, Any]] = []

    def prompt(self, n: int) -> list[int]:
        return [self.rng.choice(WORD_IDS) for _ in range(n)]

    def step(self, name: str, method: str, path: str, **kwargs: Any) -> float:
        before = gpu_memory_mib()
        started = time.monotonic()
        response = self.client.request(method, path, **kwargs)
        seconds = time.monotonic() - started
        response.raise_for_status()
        after = gpu_memory_mib()
        entry = {"step": name, "seconds": round(seconds, 3), "gpu_mib_before": before, "gpu_mib_after": after}
        self.steps.append(entry)
        print(json.dumps(entry), flush=True)
        return seconds

    def bounded(self, name: str, method: str, path: str, **kwargs: Any) -> float | None:
        """``step``, or None (and a line that says so) when it did not answer in time."""
        try:
            return self.step(name, method, path, **kwargs)
        except httpx.TimeoutException:
            entry = {"step": name, "seconds": None, "error": f"no answer in {STEP_TIMEOUT_S:.0f} s"}
            self.steps.append(entry)
            print(json.dumps(entry), flush=True)
            return None

    def complete(self, name: str, tokens: list[int], max_tokens: int = 1) -> dict[str, Any]:
        """One streamed completion: seconds to its first token, and the cached tokens vLLM reports."""
        body = {
            "model": self.model, "prompt": tokens, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        started = time.monotonic()
        first: float | None = None
        usage: dict[str, Any] = {}
        with self.client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                data = json.loads(line[5:])
                if first is None and any(c.get("text") for c in data.get("choices", [])):
                    first = time.monotonic()
                usage = data.get("usage") or usage
        ended = time.monotonic()
        details = usage.get("prompt_tokens_details") or {}
        entry = {
            "step": name, "prompt": len(tokens), "cached": details.get("cached_tokens"),
            "ttft_s": round((first or ended) - started, 3), "seconds": round(ended - started, 3),
        }  # fmt: skip
        self.steps.append(entry)
        print(json.dumps(entry), flush=True)
        return entry

    def sleeping(self) -> bool:
        return bool(self.client.get("/is_sleeping").json().get("is_sleeping"))

    def decode(self, streams: int, tokens: int) -> dict[str, Any]:
        """``streams`` streams of ``tokens`` tokens each, started together; per-stream decode rate."""
        prompts = [self.prompt(256) for _ in range(streams)]

        def one(prompt: list[int]) -> tuple[float, int]:
            body = {
                "model": self.model, "prompt": prompt, "max_tokens": tokens, "stream": True,
                "ignore_eos": True,
            }  # fmt: skip
            times: list[float] = []
            with self.client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data:") and "[DONE]" not in line:
                        times.append(time.monotonic())
            return times[-1] - times[0], len(times) - 1

        with ThreadPoolExecutor(streams) as pool:
            results = list(pool.map(one, prompts))
        rates = [gaps / seconds for seconds, gaps in results if seconds > 0]
        entry = {
            "step": f"decode x{streams}", "streams": streams, "tokens": tokens,
            "per_stream_tok_s": round(sum(rates) / len(rates), 2), "together_tok_s": round(sum(rates), 1),
        }  # fmt: skip
        self.steps.append(entry)
        print(json.dumps(entry), flush=True)
        return entry


def run(args: argparse.Namespace) -> dict[str, Any]:
    probe = Probe(args.url, args.model, args.seed)
    steps = measure(probe, args)
    return {"url": args.url, "reload": args.reload, "prompt": args.prompt, "steps": steps}


def measure(probe: Probe, args: argparse.Namespace) -> list[dict[str, Any]]:
    probe.complete("warm-up", probe.prompt(64))
    conversation = probe.prompt(args.prompt)
    probe.complete("fresh", conversation)
    probe.complete("again", conversation)
    for streams in args.streams:  # first: a sleep that hangs must not cost these
        probe.decode(streams, args.decode_tokens)
    for round_ in (1, 2):
        if probe.bounded(f"sleep level 1 (#{round_})", "POST", "/sleep", params={"level": 1}) is None:
            return probe.steps
        assert probe.sleeping()
        probe.step(f"wake level 1 (#{round_})", "POST", "/wake_up")
        probe.complete(f"after level-1 wake #{round_}", conversation)
    if probe.bounded("sleep level 2", "POST", "/sleep", params={"level": 2}) is None:
        return probe.steps
    probe.step("wake weights", "POST", "/wake_up", params={"tags": "weights"})
    if args.reload:
        probe.step("reload_weights", "POST", "/collective_rpc", json={"method": "reload_weights"})
    probe.step("wake kv_cache", "POST", "/wake_up", params={"tags": "kv_cache"})
    probe.complete("after level-2 wake", conversation)
    return probe.steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url")
    parser.add_argument("--model", default="qwen3.8-27b")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reload", action="store_true", help="reload the weights from disk after level 2")
    parser.add_argument("--prompt", type=int, default=8000, help="tokens of the cached conversation")
    parser.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16])
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=63)
    args = parser.parse_args()
    result = run(args)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
