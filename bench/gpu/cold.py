"""Cold prefills of given lengths against one running llama-server, beside what a profile predicts.

    python3 bench/gpu/cold.py http://127.0.0.1:8080 --tokens 16384 32768 --profile P.toml --out cold.json

Each prompt is fresh token ids (so nothing is reused), sent to slot 0 after erasing it, with one token
to generate: the time a client waits for the answer, the engine's own ``prompt_ms`` and the tokens it
reports processed. With ``--profile`` each line also shows the profile's cold price of that prompt, so a
measurement past the profile's grid says how far the profile extrapolates. Results append to ``--out``
(a JSON list), tagged with ``--label`` (the flag set, the model's location).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from backends.calibrate.engines import LlamaEngine, connect  # noqa: E402  (after the path is set)
from backends.engine_profiles import load_profile  # noqa: E402


async def measure(
    url: str, sizes: list[int], profile: Path | None, label: str, seed: int
) -> list[dict[str, Any]]:
    predict = load_profile(profile).prefill_seconds if profile else None
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        engine = await connect(client, seed=seed)
        if not isinstance(engine, LlamaEngine):
            raise SystemExit(f"{url} is not llama-server")
        for n in sizes:
            await engine.erase(0)
            started = time.perf_counter()
            answer = await engine.complete(engine.prompt(n), 0, 1)
            seconds = time.perf_counter() - started
            timings = answer["timings"]
            row: dict[str, Any] = {
                "label": label,
                "tokens": n,
                "seconds": round(seconds, 3),
                "prompt_ms": round(float(timings["prompt_ms"]), 1),
                "prompt_n": int(timings["prompt_n"]),
                "cache_n": int(timings.get("cache_n", 0)),
                "tok_s": round(n / seconds, 1),
            }
            if predict is not None:
                row["profile_s"] = round(predict(n), 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
        await engine.erase(0)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url")
    parser.add_argument("--tokens", type=int, nargs="+", required=True)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the prompts' seed (default: random, so a rerun meets no cache)",
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rows = asyncio.run(measure(args.url, args.tokens, args.profile, args.label, seed))
    if args.out:
        old = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps(old + rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
