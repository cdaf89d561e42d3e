"""Turns of one session through turnout to one llama-server: what each cost, what turnout predicted.

    python3 bench/gpu/turns.py --engine http://127.0.0.1:8080 --profile P.toml --turns 3 --out turns.json

Starts ``turnout serve`` (in this process, on a free loopback port) with one llama.cpp backend that
names ``--profile``, then sends ``--turns`` streamed chat turns of one session (``x-session-id``): a
first prompt of about ``--first`` tokens, then each turn the answer and ``--grow`` more tokens, as an
agent does. Per turn it prints and writes the TTFT the client saw, the engine's own prompt time, the
cached tokens, the slot, and turnout's predicted TTFT and cached tokens from its decision log.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gateway.app import create_app  # noqa: E402  (after the path is set)
from gateway.serving import ServerThread  # noqa: E402
from gateway.settings import load_settings  # noqa: E402

ADMIN_TOKEN = "gpu-run-admin"
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
]


def text(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of words (one word is about one token in these vocabularies)."""
    return " ".join(rng.choice(WORDS) for _ in range(tokens))


def config(engine: str, profile: Path | None, model: str) -> str:
    line = f'engine_profile = "{profile}"\n' if profile else ""
    return f"""
host = "127.0.0.1"
port = 0
[admin]
token = "{ADMIN_TOKEN}"
[[backends]]
id = "llama"
kind = "llamacpp"
url = "{engine}"
{line}timeouts = {{ read = 1800.0, first_byte = 1800.0 }}
[[models]]
name = "m"
architecture = "hybrid"
  [[models.deployments]]
  backend = "llama"
  upstream_name = "{model}"
"""


def turn(
    client: httpx.Client, messages: list[dict[str, str]], session: str, max_tokens: int
) -> dict[str, Any]:
    body = {"model": "m", "messages": messages, "stream": True, "max_tokens": max_tokens,
            "stream_options": {"include_usage": True}}  # fmt: skip
    started = time.perf_counter()
    ttft, answer, usage, timings = None, [], {}, {}
    headers = {"x-session-id": session}
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            raise SystemExit(f"turn failed: {response.status_code} {response.read()[:500]!r}")
        slot = response.headers.get("x-turnout-slot")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - started
                answer.append(piece)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    return {"ttft_s": ttft, "answer": "".join(answer), "usage": usage, "timings": timings, "slot": slot}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine", required=True)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--model", default="qwen3.8-flash-next", help="the engine's --alias")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--first", type=int, default=2000, help="words of the first prompt (~2 tokens each)")
    parser.add_argument("--grow", type=int, default=250, help="words each later turn adds")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rng = random.Random(7)
    path = Path("/tmp/turnout-turns.toml")
    path.write_text(config(args.engine, args.profile, args.model))
    settings = load_settings(path)
    server = ServerThread(create_app(settings)).start()
    results = []
    try:
        with httpx.Client(base_url=server.url, timeout=3600) as client:
            messages = [{"role": "system", "content": "You are a coding agent."},
                        {"role": "user", "content": text(rng, args.first)}]  # fmt: skip
            for index in range(args.turns):
                got = turn(client, messages, "gpu-run-session", args.max_tokens)
                admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
                log = client.get("/admin/api/decisions", params={"limit": 1}, headers=admin).json()
                decision = log["data"][0]
                chosen = next(c for c in decision["candidates"] if c["backend"] == decision["chosen"])
                usage = got["usage"]
                row = {
                    "turn": index + 1,
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                    "ttft_s": round(got["ttft_s"] or 0.0, 3),
                    "engine_prompt_ms": got["timings"].get("prompt_ms"),
                    "slot": decision.get("slot"),
                    "predicted_ttft_s": chosen.get("predicted_ttft_s"),
                    "predicted_cached_tokens": chosen.get("expected_cached_tokens"),
                }
                results.append(row)
                print(json.dumps(row), flush=True)
                messages += [{"role": "assistant", "content": got["answer"] or "ok"},
                             {"role": "user", "content": text(rng, args.grow)}]  # fmt: skip
    finally:
        server.stop()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
