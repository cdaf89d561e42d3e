"""Agent sessions and fresh prompts through turnout to one engine: cost and prediction per turn.

    python3 bench/gpu/turns.py --engine http://127.0.0.1:8080 --profile P.toml --turns 4 \
        --grow 300 1500 5000 --fresh 1024 16384 --out turns.json

Starts ``turnout serve`` (in this process, on a free loopback port) with one backend (``--kind``:
llama-server or vLLM) that names ``--profile`` and one model whose ``chars_per_token`` is the engine's
own on these words (``/tokenize``), then sends, for each ``--grow`` value, ``--turns``
streamed chat turns of one session (``x-session-id``): a first prompt of about ``--first`` words, then
each turn the answer and ``--grow`` more words, as an agent does; then each ``--fresh`` size as a
one-turn session of new words (``--warm``: one request of so many words first, not measured: an
engine's first request pays its setup). Every answer is ``--max-tokens`` tokens (``ignore_eos``). Per turn it
prints and writes the TTFT and the time to the last token the client saw, the engine's own prompt
time, the cached tokens, the slot, and what turnout predicted for each (its decision log); the summary
is the agreement: median and worst |error| of both times, for the sessions' turns and the fresh prompts.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from backends.calibrate.engines import WORDS  # noqa: E402  (after the path is set)
from gateway.app import create_app  # noqa: E402  (after the path is set)
from gateway.serving import ServerThread  # noqa: E402
from gateway.settings import load_settings  # noqa: E402

ADMIN_TOKEN = "gpu-run-admin"
PRIOR_CHARS = 3.6
"""turnout's default ``chars_per_token`` (``ModelConfig``), kept where the engine cannot tokenize."""
VOCABULARY = WORDS.split()
"""calibrate's words: each is one token of bench/gpu/vllm_model.py's tokenizer (others would all be
its unknown id, and every prompt the same), a few tokens of a GGUF's."""


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(words))


def chars_per_token(engine: str, kind: str, model: str) -> float:
    """The engine's own characters per token on these prompts' words, for the model's
    ``chars_per_token`` (as an operator sets it for a model whose text differs from most). Without it
    turnout prices a run's first prompt from its prior, 3.6, until learning has seen one answer:
    calibrate's words average more characters a token, so the first 2,014-token turn on the H100's
    vLLM was priced as ~3,700 tokens (0.307 s predicted, 0.211 s measured)."""
    sample = text(random.Random(0), 2000)
    body: dict[str, Any] = {"content": sample} if kind == "llamacpp" else {"model": model, "prompt": sample}
    try:
        response = httpx.post(engine.rstrip("/") + "/tokenize", json=body, timeout=60)
        response.raise_for_status()
        data = response.json()
        return len(sample) / max(1, int(data.get("count") or len(data["tokens"])))
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
        print(f"no /tokenize answer ({exc!r}): the model keeps turnout's prior, {PRIOR_CHARS}", flush=True)
        return PRIOR_CHARS


def config(engine: str, kind: str, profile: Path | None, model: str, chars: float) -> str:
    line = f'engine_profile = "{profile}"\n' if profile else ""
    return f"""
host = "127.0.0.1"
port = 0
[admin]
token = "{ADMIN_TOKEN}"
[[backends]]
id = "engine"
kind = "{kind}"
url = "{engine}"
{line}timeouts = {{ read = 1800.0, first_byte = 1800.0 }}
[[models]]
name = "m"
architecture = "hybrid"
chars_per_token = {chars:.4f}
  [[models.deployments]]
  backend = "engine"
  upstream_name = "{model}"
"""


def turn(
    client: httpx.Client, messages: list[dict[str, str]], session: str, max_tokens: int
) -> dict[str, Any]:
    body = {"model": "m", "messages": messages, "stream": True, "max_tokens": max_tokens,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    started = time.perf_counter()
    ttft: float | None = None
    last: float | None = None
    answer: list[str] = []
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    headers = {"x-session-id": session}
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            raise SystemExit(f"turn failed: {response.status_code} {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece or choice.get("finish_reason"):  # the answer's end: its last token
                    last = time.perf_counter() - started
                if piece and ttft is None:
                    ttft = last
                answer.append(piece)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    return {"ttft_s": ttft, "last_s": last, "answer": "".join(answer), "usage": usage, "timings": timings}


def measured(
    client: httpx.Client, messages: list[dict[str, str]], session: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One turn, beside what turnout's decision log predicted for it."""
    got = turn(client, messages, session, args.max_tokens)
    admin = {"authorization": f"Bearer {args.admin_token}"}
    response = client.get("/admin/api/decisions", params={"limit": 1}, headers=admin)
    if response.status_code != 200:
        raise SystemExit(f"decision log: {response.status_code} {response.text[:300]}")
    log = response.json()
    decision = log["data"][0]
    chosen = next(c for c in decision["candidates"] if c["backend"] == decision["chosen"])
    usage = got["usage"]
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "ttft_s": round(got["ttft_s"] or 0.0, 3),
        "total_s": round(got["last_s"] or 0.0, 3),
        "engine_prompt_ms": got["timings"].get("prompt_ms"),
        "slot": decision.get("slot"),
        "predicted_ttft_s": chosen.get("predicted_ttft_s"),
        "predicted_total_s": chosen.get("predicted_total_s"),
        "predicted_cached_tokens": chosen.get("expected_cached_tokens"),
        "answer": got["answer"] or "ok",
    }


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst |predicted - measured| / measured of the TTFT and of the time to the last token."""
    out: dict[str, Any] = {"n": len(rows)}
    for what in ("ttft_s", "total_s"):
        errors = sorted(
            abs(r[f"predicted_{what}"] - r[what]) / r[what]
            for r in rows
            if r[what] and r.get(f"predicted_{what}") is not None
        )
        if errors:
            out[what] = {"median": round(statistics.median(errors), 3), "worst": round(errors[-1], 3)}
    return out


def run(client: httpx.Client, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def keep(row: dict[str, Any]) -> str:
        answer = row.pop("answer")
        rows.append(row)
        print(json.dumps(row), flush=True)
        return str(answer)

    if args.warm:  # the server's first request sets things up (311 ms for 16 tokens on the H100's 27B,
        # 197 ms the second time): sent through turnout, so that it knows the slot the request leaves,
        # with the turns' answer length (a one-token answer taught turnout this client's answers are
        # short: the first turns' time to the last token came out 64-81% low, 2026-12-07d)
        rng = random.Random(f"{args.seed}-warm")
        warm = [{"role": "user", "content": text(rng, args.warm)}]
        turn(client, warm, f"gpu-run-{args.seed}-warm", args.max_tokens)
    for index, grow in enumerate(args.grow):
        rng = random.Random(f"{args.seed}-session-{index}")  # a session's words are its own
        messages = [{"role": "system", "content": "You are a coding agent."},
                    {"role": "user", "content": text(rng, args.first)}]  # fmt: skip
        session = f"gpu-run-{args.seed}-grow-{grow}-{index}"
        for number in range(1, args.turns + 1):
            got = measured(client, messages, session, args)
            answer = keep({"kind": "turn", "grow": grow, "turn": number, **got})
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": text(rng, grow)}]  # fmt: skip
    for index, words in enumerate(args.fresh):
        rng = random.Random(f"{args.seed}-fresh-{index}")
        messages = [{"role": "user", "content": text(rng, words)}]
        got = measured(client, messages, f"gpu-run-{args.seed}-fresh-{index}", args)
        keep({"kind": "fresh", "words": words, **got})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", required=True)
    parser.add_argument("--kind", choices=("llamacpp", "vllm"), default="llamacpp")
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--model", default="qwen3.8-flash-next", help="the engine's served model name")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--first", type=int, default=2000, help="words of a session's first prompt")
    parser.add_argument(
        "--grow", type=int, nargs="*", default=[250], help="words a turn adds, a session each"
    )
    parser.add_argument("--fresh", type=int, nargs="*", default=[], help="words of each fresh prompt")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--warm", type=int, default=0, help="words of one request sent first and not measured (0: none)"
    )
    parser.add_argument("--seed", default=str(random.SystemRandom().randrange(1 << 31)),
                        help="the prompts' seed (default: random, so a rerun meets no cache)")  # fmt: skip
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp()) / "turnout-turns.toml"
    chars = chars_per_token(args.engine, args.kind, args.model)
    print(f"chars per token (the engine's tokenizer on these words): {chars:.3f}", flush=True)
    path.write_text(config(args.engine, args.kind, args.profile, args.model, chars))
    settings = load_settings(path)
    token = settings.admin.token  # TURNOUT_ADMIN__TOKEN, where set, wins over the file's
    args.admin_token = token.get_secret_value() if token else ADMIN_TOKEN
    server = ServerThread(create_app(settings)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=3600) as client:
            rows = run(client, args)
    finally:
        server.stop()
    summary = {
        "turns": agreement([r for r in rows if r["kind"] == "turn"]),
        "fresh": agreement([r for r in rows if r["kind"] == "fresh"]),
    }
    print(json.dumps({"agreement": summary}), flush=True)
    if args.out:
        out = {"rows": rows, "agreement": summary, "chars_per_token": round(chars, 4)}
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
