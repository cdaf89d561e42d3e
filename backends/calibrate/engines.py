"""The two engines as ``turnout calibrate`` talks to them: one measurement per call, through their own APIs.

llama-server reports its own timings on every answer (``timings.prompt_n``, ``cache_n``,
``predicted_ms``): the tokens it processed and reused, and its decode time. A request is pinned to a
slot (``id_slot``) so that warm turns, checkpoint restores and RAM cache restores are measured where
they happen. vLLM reports no timings: a prefill is the time to
its first streamed token, a decode step the gap between the first and the last token over the tokens
between. Both engines' prefills are timed as a client sees them (the fit gives the fixed part of a
request its own coefficient, ``request_s``).

Prompts are token ids (``/tokenize`` of a random word list, then sampled by a seeded RNG): exact
lengths, and a fresh prompt never meets a cached one by accident.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import httpx

from backends.calibrate.together import Tick, decode_together
from backends.parsers.vllm import parse_metrics

EngineName = Literal["vllm", "llamacpp"]
WORDS = (
    "river stone garden window paper engine signal market orbit lantern copper meadow velvet harbor "
    "thunder pencil canyon rocket silver forest ladder mirror planet winter sugar marble violet "
    "tunnel bridge cotton falcon island candle jacket monkey needle ocean pepper quartz saddle"
)


class CalibrationError(Exception):
    """The engine cannot be calibrated (unreachable, busy, unknown); the message says why."""


Saved = tuple[int, int]
"""A slot llama-server saved to its RAM cache: the tokens and the context checkpoints it held."""


@dataclass(frozen=True, slots=True)
class Prefill:
    """One prompt processed: ``seconds`` for ``processed`` new tokens after ``cached`` reused ones."""

    seconds: float
    processed: int
    cached: int
    saved: tuple[Saved, ...] = ()
    """llama.cpp: the slots the server saved to its RAM cache first (``saves``)."""


@dataclass(frozen=True, slots=True)
class EngineInfo:
    engine: EngineName
    model: str
    window: int
    slots: int
    notes: tuple[str, ...] = ()
    block: int = 0
    """vLLM: the block its prefix cache hits come in, as its ``/metrics`` says (0: not said, or off)."""


class Engine:
    """What both engines share: the HTTP client, the prompt factory."""

    engine: EngineName

    def __init__(
        self, client: httpx.AsyncClient, info: EngineInfo, vocabulary: Sequence[int], seed: int
    ) -> None:
        self.client, self.info = client, info
        self.vocabulary = list(vocabulary)
        self.rng = random.Random(seed)

    def prompt(self, n: int) -> list[int]:
        """``n`` fresh token ids."""
        return [self.rng.choice(self.vocabulary) for _ in range(n)]

    async def busy(self) -> int:
        """Requests the engine is working on now (0: idle)."""
        raise NotImplementedError

    async def prefill(self, tokens: Sequence[int], slot: int = 0) -> Prefill:
        raise NotImplementedError

    async def decode(self, prompts: Sequence[Sequence[int]], n_tokens: int) -> float:
        """Seconds per decode step with ``len(prompts)`` sequences generating together."""
        raise NotImplementedError

    async def erase(self, slot: int) -> None:
        """Forget what ``slot`` holds (llama.cpp; vLLM has no slots)."""

    async def prefix_hit(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` the engine reports reused when sent again (vLLM's prefix cache)."""
        return 0


class LlamaEngine(Engine):
    engine: EngineName = "llamacpp"

    async def busy(self) -> int:
        slots = (await _get(self.client, "/slots")).json()
        return sum(1 for slot in slots if slot.get("is_processing"))

    async def complete(self, tokens: Sequence[int], slot: int, n_predict: int) -> dict[str, Any]:
        body = {
            "prompt": list(tokens),
            "n_predict": n_predict,
            "id_slot": slot,
            "cache_prompt": True,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        response = await self.client.post("/completion", json=body)
        if response.status_code != 200:
            raise CalibrationError(f"llama-server answered {response.status_code}: {response.text[:300]}")
        data: dict[str, Any] = response.json()
        return data

    async def prefill(self, tokens: Sequence[int], slot: int = 0) -> Prefill:
        """The request's time to its one token, as a client sees it (the engine's ``prompt_ms`` leaves
        out what it does before and after: parsing, slot selection, saving idle slots to RAM)."""
        started = time.perf_counter()
        timings = (await self.complete(tokens, slot, 1))["timings"]
        seconds = time.perf_counter() - started
        return Prefill(seconds, int(timings["prompt_n"]), int(timings.get("cache_n", 0)))

    async def decode(self, prompts: Sequence[Sequence[int]], n_tokens: int) -> float:
        """Each prompt on its own slot, streamed (``together``: timed once all of them decode)."""
        streams = [
            partial(self._stream, p, i, _limit(self.info.window, p, n_tokens)) for i, p in enumerate(prompts)
        ]
        step = await decode_together(streams, n_tokens)
        await _settle(self)
        return step

    async def _stream(self, tokens: Sequence[int], slot: int, limit: int, tick: Tick) -> None:
        body = {"prompt": list(tokens), "n_predict": limit, "id_slot": slot, "cache_prompt": True,
                "ignore_eos": True, "temperature": 0.0, "stream": True}  # fmt: skip
        async with _streamed(self.client, "/completion", body, "llama-server") as chunks:
            async for chunk in chunks:
                if chunk.get("stop") or ("content" in chunk and tick()):
                    return

    async def erase(self, slot: int) -> None:
        """``POST /slots/{id}?action=erase`` (served only with ``--slot-save-path``); otherwise the slot
        is left holding one token, none of the calibration's prompts."""
        response = await self.client.post(f"/slots/{slot}", params={"action": "erase"})
        if response.status_code == 501:
            await self.complete(self.prompt(1), slot, 1)
        elif response.status_code != 200:
            raise CalibrationError(
                f"could not erase slot {slot}: {response.status_code} {response.text[:200]}"
            )


class VllmEngine(Engine):
    engine: EngineName = "vllm"

    async def busy(self) -> int:
        text = (await _get(self.client, "/metrics")).text
        return round(
            sum(_metric(text, name) for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"))
        )

    async def _stream(self, tokens: Sequence[int], n_tokens: int) -> tuple[float, float, int, int]:
        """(time to first token, time of the last, tokens streamed, cached tokens reported)."""
        body = {
            "model": self.info.model,
            "prompt": list(tokens),
            "max_tokens": n_tokens,
            "min_tokens": n_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        started = time.perf_counter()
        first = last = 0.0
        count = cached = 0
        async with _streamed(self.client, "/v1/completions", body, "vLLM") as chunks:
            async for chunk in chunks:
                if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                    last = time.perf_counter() - started
                    first = first or last
                    count += 1
                details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
                cached = int(details.get("cached_tokens") or cached)
        return first, last, count, cached

    async def prefill(self, tokens: Sequence[int], slot: int = 0) -> Prefill:
        first, _, _, cached = await self._stream(tokens, 1)
        return Prefill(first, len(tokens) - cached, cached)

    async def decode(self, prompts: Sequence[Sequence[int]], n_tokens: int) -> float:
        """The prompts streamed together (``together``: timed once all of them decode)."""
        streams = [partial(self._decode_stream, p, _limit(self.info.window, p, n_tokens)) for p in prompts]
        step = await decode_together(streams, n_tokens)
        await _settle(self)
        return step

    async def _decode_stream(self, tokens: Sequence[int], limit: int, tick: Tick) -> None:
        body = {"model": self.info.model, "prompt": list(tokens), "max_tokens": limit, "min_tokens": limit,
                "ignore_eos": True, "temperature": 0.0, "stream": True}  # fmt: skip
        async with _streamed(self.client, "/v1/completions", body, "vLLM") as chunks:
            async for chunk in chunks:
                choices = chunk.get("choices") or []
                if choices and choices[0].get("text") is not None and tick():
                    return

    async def prefix_hit(self, tokens: Sequence[int]) -> int:
        await self._stream(tokens, 1)
        return (await self._stream(tokens, 1))[3]


async def connect(client: httpx.AsyncClient, seed: int = 0) -> Engine:
    """Find out which engine answers at the client's base URL and how it is set up."""
    try:
        props = await client.get("/props")
    except httpx.HTTPError as exc:
        raise CalibrationError(f"cannot reach {client.base_url}: {exc!r}") from exc
    if props.status_code == 200 and "total_slots" in props.text:
        data = props.json()
        slots = int(data.get("total_slots", 1))
        settings = data.get("default_generation_settings", {})
        window = int(settings.get("n_ctx") or data.get("n_ctx") or 0)
        model = str(data.get("model_alias") or data.get("model_path") or "llama-server")
        info = EngineInfo("llamacpp", model, window, slots)
        vocabulary = (await _post(client, "/tokenize", {"content": WORDS * 4})).json()["tokens"]
        return LlamaEngine(client, info, _varied(vocabulary), seed)
    metrics = await _get(client, "/metrics")
    if "vllm:" not in metrics.text:
        raise CalibrationError(f"{client.base_url} is neither llama-server (/props) nor vLLM (/metrics)")
    models = (await _get(client, "/v1/models")).json()["data"]
    model = models[0]
    block = parse_metrics(metrics.text).cache_block or 0
    info = EngineInfo("vllm", str(model["id"]), int(model.get("max_model_len") or 0), 1, block=block)
    tokenized = (await _post(client, "/tokenize", {"model": info.model, "prompt": WORDS * 4})).json()
    engine = VllmEngine(client, info, _varied(tokenized["tokens"]), seed)
    await engine.prefill(engine.prompt(8))  # the first request pays for warming up: not a measurement
    return engine


@asynccontextmanager
async def _streamed(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], engine: str
) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
    """A streamed answer's events (its ``data:`` lines, parsed; ``[DONE]`` left out), or
    :class:`CalibrationError` for any status but 200. Leaving the block closes the stream: the engine
    drops the request."""
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            raise CalibrationError(
                f"{engine} answered {response.status_code}: {(await response.aread())[:300]!r}"
            )
        yield _events(response)


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk: dict[str, Any] = json.loads(line[6:])
            yield chunk


DECODE_LIMIT = 4096
"""The most tokens a decode point's sequence may make while it waits for the others to start: its
stream is closed once all of them have made enough (``together``)."""
SETTLE_S = 10.0


def _limit(window: int, prompt: Sequence[int], n_tokens: int) -> int:
    """Tokens a decode sequence may ask for: up to ``DECODE_LIMIT``, within the context window."""
    room = window - len(prompt) - 8 if window > 0 else DECODE_LIMIT
    return max(n_tokens + 1, min(DECODE_LIMIT, room))


async def _settle(engine: Engine) -> None:
    """Wait (up to ``SETTLE_S``) for the engine to drop the streams ``decode`` closed: an aborted
    request still running would share the next measurement's steps."""
    deadline = time.perf_counter() + SETTLE_S
    while time.perf_counter() < deadline:
        if not await engine.busy():
            return
        await asyncio.sleep(0.05)


MIN_DISTINCT_TOKENS = 16
"""Fewer distinct ids than this and two fresh prompts would share prefixes by chance."""


def _varied(tokens: Sequence[int]) -> list[int]:
    """The ids prompts are drawn from: the tokenizer must tell the word list's words apart (a
    tokenizer that maps unknown words to one id would make every "fresh" prompt a cached one)."""
    distinct = sorted(set(tokens))
    if len(distinct) < MIN_DISTINCT_TOKENS:
        raise CalibrationError(
            f"the engine's tokenizer gives {len(distinct)} distinct token id(s) for calibrate's word "
            f"list (at least {MIN_DISTINCT_TOKENS} needed): fresh prompts would repeat each other and "
            "be served from the prefix cache"
        )
    return list(tokens)


async def _get(client: httpx.AsyncClient, path: str) -> httpx.Response:
    try:
        response = await client.get(path)
    except httpx.HTTPError as exc:
        raise CalibrationError(f"cannot reach {client.base_url}{path}: {exc!r}") from exc
    if response.status_code == 503:
        raise CalibrationError(
            f"{client.base_url} is not ready (503: {response.text[:200]}); try again once loaded"
        )
    if response.status_code != 200:
        raise CalibrationError(
            f"{client.base_url}{path} answered {response.status_code}: {response.text[:200]}"
        )
    return response


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    try:
        response = await client.post(path, json=body)
    except httpx.HTTPError as exc:
        raise CalibrationError(f"cannot reach {client.base_url}{path}: {exc!r}") from exc
    if response.status_code != 200:
        raise CalibrationError(
            f"{client.base_url}{path} answered {response.status_code}: {response.text[:200]}"
        )
    return response


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return total
