"""Decode under concurrency: N streamed completions at once against one engine (vLLM or llama-server).

    python3 bench/gpu/streams.py http://127.0.0.1:8080 --streams 1 4 16 --tokens 128 --out streams.json

For each N it sends N streamed ``/v1/completions`` (distinct prompts of about ``--prompt`` tokens, so
no prefix is shared; ``ignore_eos`` so each answer is ``--tokens`` long) at the same moment, and
reports per stream the time between tokens (first to last token over the tokens between them) and,
for the batch, the tokens per second all streams together produced while all were decoding. One
warm-up request comes first. Prints a line per N and writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]


async def one(client: httpx.AsyncClient, model: str, prompt: str, tokens: int) -> dict[str, Any]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    times: list[float] = []
    started = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("text"):
                times.append(time.perf_counter())
    if len(times) < 2:
        raise RuntimeError(f"a stream gave {len(times)} tokens")
    return {"start": started, "first": times[0], "last": times[-1], "tokens": len(times)}


async def batch(
    client: httpx.AsyncClient, model: str, n: int, prompt: int, tokens: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    prompts = [f"{i} {seed} " + " ".join(rng.choice(WORDS) for _ in range(prompt)) for i in range(n)]
    runs = await asyncio.gather(*(one(client, model, p, tokens) for p in prompts))
    itl = [(r["last"] - r["first"]) / (r["tokens"] - 1) for r in runs]
    # all streams decoding: from the last first token to the first last token
    together_from, together_to = max(r["first"] for r in runs), min(r["last"] for r in runs)
    produced = 0.0
    for r in runs:
        rate = (r["tokens"] - 1) / (r["last"] - r["first"])
        produced += rate * max(0.0, together_to - together_from)
    span = together_to - together_from
    return {
        "streams": n,
        "tokens_per_stream": tokens,
        "itl_ms_median": 1000 * statistics.median(itl),
        "itl_ms_max": 1000 * max(itl),
        "ttft_s_max": max(r["first"] - r["start"] for r in runs),
        "tokens_per_s_together": produced / span if span > 0 else None,
        "wall_s": max(r["last"] for r in runs) - min(r["start"] for r in runs),
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=args.url, timeout=httpx.Timeout(600.0)) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        await batch(client, model, 1, args.prompt, 16, seed=-1)  # warm-up
        rows = []
        for n in args.streams:
            row = await batch(client, model, n, args.prompt, args.tokens, seed=n)
            row["label"] = args.label
            rows.append(row)
            together = row["tokens_per_s_together"]
            print(
                f"{args.label} {n:>3} stream(s): {row['itl_ms_median']:.1f} ms between tokens (median, max "
                f"{row['itl_ms_max']:.1f}), {together:.0f} tok/s together, first token within "
                f"{row['ttft_s_max']:.2f} s",
                flush=True,
            )
        return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--tokens", type=int, default=128, help="tokens each stream decodes")
    parser.add_argument("--prompt", type=int, default=64, help="words of each prompt")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    if args.out:
        old = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps(old + rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
