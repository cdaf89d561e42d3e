"""What llama-server's slot bookkeeping costs on the GPU (issue #63): a RAM-cache save by the tokens
and context checkpoints the slot holds, and a checkpoint restore against a live-state append.

Against a running llama-server with two slots or more (``--cache-ram`` on, ``--cache-idle-slots`` by
default). For each (tokens, turns) pair, slot 0 gets a conversation of ``tokens`` tokens that then grows
by ``--grow`` tokens a turn, ``turns`` turns in all; the turns alternate between

- **append**: the prompt continues the slot's tokens (a one-token answer is not decoded, so the slot
  holds the prompt: the live state is used as is), and
- **restore**: the prompt drops the conversation's last two tokens before its new ones (the slot
  restores its newest checkpoint, 4 tokens before the end, and re-processes from there),

so the difference between the two, beyond their new tokens, is the restore. Then slot 1 continues its
own prompt twice: the first time the server saves slot 0 after the launch (it is idle and not saved
yet), the second time there is nothing to save; the difference of the two (each without its own
``prompt_ms``) is the save of slot 0. Each pair is repeated ``--repeat`` times. One JSON row a
measurement (printed and written to ``--out``); run the server with ``-lv 4 --log-timestamps`` to have
its own account (state sizes, checkpoints) beside it.

    python bench/gpu/slot_costs.py http://127.0.0.1:8080 --out slot-costs.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from backends.calibrate.engines import LlamaEngine, connect

PAIRS = ((1024, 1), (1024, 8), (1024, 24), (8192, 1), (8192, 8), (4096, 16))


async def timed(engine: LlamaEngine, tokens: list[int], slot: int) -> dict[str, Any]:
    """One request of one token; the client's seconds beside the server's own prompt time."""
    body = {
        "prompt": tokens,
        "n_predict": 1,
        "id_slot": slot,
        "cache_prompt": True,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    started = time.perf_counter()
    response = await engine.client.post("/completion", json=body)
    wall = time.perf_counter() - started
    response.raise_for_status()
    data = response.json()
    timings = data["timings"]
    return {
        "wall_s": round(wall, 4),
        "prompt_s": round(float(timings["prompt_ms"]) / 1000, 4),
        "new": int(timings["prompt_n"]),
        "cached": int(timings.get("cache_n", 0)),
    }


async def pair(
    engine: LlamaEngine, tokens: int, turns: int, grow: int, tail: list[int]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    conversation = engine.prompt(tokens)
    first = await timed(engine, conversation, 0)
    rows.append({"what": "first", "tokens": tokens, **first})
    for turn in range(1, turns):
        append = turn % 2 == 1
        prompt = (conversation if append else conversation[:-2]) + engine.prompt(grow)
        got = await timed(engine, prompt, 0)
        rows.append({"what": "append" if append else "restore", "turn": turn, "tokens": len(prompt), **got})
        conversation = prompt
    tail.extend(engine.prompt(16))
    waited = await timed(engine, list(tail), 1)
    tail.extend(engine.prompt(16))
    alone = await timed(engine, list(tail), 1)
    save = (waited["wall_s"] - waited["prompt_s"]) - (alone["wall_s"] - alone["prompt_s"])
    rows.append(
        {
            "what": "save",
            "tokens": len(conversation),
            "turns": turns,
            "save_s": round(save, 4),
            "waited": waited,
            "alone": alone,
        }
    )
    return rows


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=args.engine, timeout=600) as client:
        engine = await connect(client, seed=args.seed)
        if not isinstance(engine, LlamaEngine) or engine.info.slots < 2:
            raise SystemExit("needs llama-server with two slots or more")
        tail = engine.prompt(256)
        await timed(engine, list(tail), 1)
        for tokens, turns in PAIRS:
            for repeat in range(args.repeat):
                for row in await pair(engine, tokens, turns, args.grow, tail):
                    row = {"pair": [tokens, turns], "repeat": repeat, **row}
                    print(json.dumps(row), flush=True)
                    out.append(row)
    saves: dict[tuple[int, int], list[float]] = {}
    for row in out:
        if row["what"] == "save":
            saves.setdefault(tuple(row["pair"]), []).append(row["save_s"])
    for key, values in saves.items():
        median = statistics.median(values)
        print(f"save, {key[0]} tokens then {key[1]} turns: median {median:.3f} s of {values}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("engine")
    parser.add_argument("--grow", type=int, default=300, help="new tokens a turn")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
