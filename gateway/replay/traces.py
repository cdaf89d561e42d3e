"""Request traces: turnout's JSONL format, the Mooncake reader, and scaling.

turnout's format, one request per line (``t`` ascending is not required; readers sort)::

    {"t": 12.5, "session": "agent-0" | null, "model": "m", "input_tokens": 20480,
     "hash_ids": [0, 1, 2, ...], "max_tokens": 256, "agent": true}

``t`` is the arrival in seconds from the trace start; ``hash_ids`` name the prompt's 512-token blocks
(Mooncake-style: equal ids mean equal text, so requests sharing a leading run of ids share that prefix;
the last block may be partial). Instead of ``hash_ids`` a line may give ``"messages"`` (OpenAI chat
messages) to send literally. Requests of one ``session`` are sent one after the other, with
``x-session-id: <session>``. ``agent`` (default false) marks an agent's call, whose client waits for
the whole answer: it is sent with ``x-turnout-wait-for: last-token`` and judged on its time to the
last token (docs/benchmarks.md).

Mooncake (``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``) has no sessions:
requests share prefixes only through their ``hash_ids``.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TextIO

BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block (Mooncake's block size)."""
TraceFormat = Literal["turnout", "mooncake"]


class TraceError(ValueError):
    """A trace line that does not parse; the message names the line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace."""

    t: float
    session: str | None
    model: str
    input_tokens: int
    hash_ids: tuple[int, ...]
    max_tokens: int
    messages: tuple[dict[str, Any], ...] | None = None
    agent: bool = False
    """An agent's call: its client acts on the whole answer (sent with ``x-turnout-wait-for:
    last-token``, ``policies.awaited``)."""
    splits: tuple[int, ...] = ()
    """Where the prompt's chat messages end, in tokens of its text: a user message, an assistant
    message, a user message and so on, the last user message running to the end (a conversation's
    earlier turns and their answers, as a chat client resends them: ``synth.threaded`` derives it
    from the conversation; never read from or written to a trace). Empty: one user message."""

    def to_json(self) -> dict[str, Any]:
        """The turnout JSONL object of this request (``messages`` only when given)."""
        out: dict[str, Any] = {
            "t": round(self.t, 6),
            "session": self.session,
            "model": self.model,
            "input_tokens": self.input_tokens,
            "hash_ids": list(self.hash_ids),
            "max_tokens": self.max_tokens,
        }
        if self.messages is not None:
            out["messages"] = list(self.messages)
        if self.agent:
            out["agent"] = True
        return out


def _int(obj: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(f"{where}: '{key}' must be a non-negative integer")
    return value


def _ids(obj: dict[str, Any], where: str) -> tuple[int, ...]:
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise TraceError(f"{where}: 'hash_ids' must be a list of integers")
    return tuple(ids)


def parse_turnout(obj: Any, where: str, default_model: str = "replay") -> TraceRequest:
    """One turnout trace object -> :class:`TraceRequest`; raises :class:`TraceError`."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object")
    t = obj.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float) or t < 0:
        raise TraceError(f"{where}: 't' must be a non-negative number")
    session = obj.get("session")
    if session is not None and not isinstance(session, str):
        raise TraceError(f"{where}: 'session' must be a string or null")
    model = obj.get("model", default_model)
    if not isinstance(model, str):
        raise TraceError(f"{where}: 'model' must be a string")
    messages = obj.get("messages")
    if messages is not None and not (isinstance(messages, list) and messages):
        raise TraceError(f"{where}: 'messages' must be a non-empty list")
    ids = _ids(obj, where)
    if not ids and messages is None:
        raise TraceError(f"{where}: needs 'hash_ids' or 'messages'")
    return TraceRequest(
        t=float(t),
        session=session,
        model=model,
        input_tokens=_int(obj, "input_tokens", where, default=len(ids) * BLOCK_TOKENS),
        hash_ids=ids,
        max_tokens=max(_int(obj, "max_tokens", where, default=128), 1),
        messages=tuple(messages) if messages is not None else None,
        agent=_agent(obj, where),
    )


def _agent(obj: dict[str, Any], where: str) -> bool:
    agent = obj.get("agent", False)
    if not isinstance(agent, bool):
        raise TraceError(f"{where}: 'agent' must be true or false")
    return agent


def parse_mooncake(obj: Any, where: str, model: str = "replay") -> TraceRequest:
    """One Mooncake trace object -> :class:`TraceRequest` (ms -> s; ``output_length`` -> max_tokens)."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object")
    ids = _ids(obj, where)
    if not ids:
        raise TraceError(f"{where}: 'hash_ids' must not be empty")
    return TraceRequest(
        t=_int(obj, "timestamp", where) / 1000.0,
        session=None,
        model=model,
        input_tokens=_int(obj, "input_length", where),
        hash_ids=ids,
        max_tokens=max(_int(obj, "output_length", where), 1),
    )


def parse_lines(
    lines: Iterable[str], fmt: TraceFormat = "turnout", model: str = "replay"
) -> list[TraceRequest]:
    """Parse JSONL ``lines`` (blank lines skipped), sorted by arrival (stable)."""
    parse = parse_turnout if fmt == "turnout" else parse_mooncake
    out: list[TraceRequest] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"line {number}: not JSON: {exc.msg}") from exc
        out.append(parse(obj, f"line {number}", model))
    return sorted(out, key=lambda r: r.t)


def read_trace(
    path: Path, fmt: TraceFormat = "turnout", model: str = "replay", limit: int | None = None
) -> list[TraceRequest]:
    """Read a trace file (gzip-compressed when its name ends in ``.gz``); with ``limit``, only its first
    ``limit`` lines are read (then sorted)."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as packed:
            return parse_lines(_head(packed, limit), fmt, model)
    with path.open(encoding="utf-8") as handle:
        return parse_lines(_head(handle, limit), fmt, model)


def _head(handle: TextIO, limit: int | None) -> Iterator[str]:
    for index, line in enumerate(handle):
        if limit is not None and index >= limit:
            return
        yield line


def write_trace(requests: Iterable[TraceRequest], out: TextIO, fmt: TraceFormat = "turnout") -> None:
    """Write ``requests`` as turnout JSONL, or as Mooncake JSONL (no sessions, times in ms)."""
    for request in requests:
        obj = request.to_json() if fmt == "turnout" else to_mooncake(request)
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")


def to_mooncake(request: TraceRequest) -> dict[str, Any]:
    """The Mooncake object of ``request``: its session is dropped (Mooncake has none)."""
    return {
        "timestamp": round(request.t * 1000),
        "input_length": request.input_tokens,
        "output_length": request.max_tokens,
        "hash_ids": list(request.hash_ids),
    }


def scale_tokens(requests: Sequence[TraceRequest], factor: float) -> list[TraceRequest]:
    """Token lengths times ``factor``: ``input_tokens`` and ``max_tokens`` (at least 1).

    Block ids stay as they are; the synthesizer makes each block ``round(512 * factor)`` tokens long
    (:func:`block_tokens`), so prefix sharing is preserved.
    """
    if factor == 1.0:
        return list(requests)
    return [
        replace(
            r,
            input_tokens=max(round(r.input_tokens * factor), 1),
            max_tokens=max(round(r.max_tokens * factor), 1),
        )
        for r in requests
    ]


def block_tokens(factor: float) -> int:
    """Tokens per block after scaling lengths by ``factor``: ``max(round(512 * factor), 1)``."""
    return max(round(BLOCK_TOKENS * factor), 1)


def with_rate(requests: Sequence[TraceRequest], factor: float) -> list[TraceRequest]:
    """The arrival rate times ``factor``: every arrival time (from the first) divided by it."""
    if factor <= 0:
        raise ValueError(f"the rate factor must be positive, not {factor}")
    if factor == 1.0 or not requests:
        return list(requests)
    t0 = requests[0].t
    return [replace(r, t=t0 + (r.t - t0) / factor) for r in requests]


def last_minutes(requests: Sequence[TraceRequest], minutes: float) -> list[TraceRequest]:
    """The requests that arrived in the trace's last ``minutes`` (up to its last arrival), sorted."""
    ordered = sorted(requests, key=lambda r: r.t)
    if not ordered:
        return []
    since = ordered[-1].t - minutes * 60
    return [r for r in ordered if r.t >= since]


def rate_for_load(requests: Sequence[TraceRequest], load: float, prefill_tok_s: float) -> float:
    """The rate factor at which the trace's prompt tokens, without any reuse, are ``load`` of a
    fleet's prefill capacity (``prefill_tok_s``, all engines together) over the trace's span:
    ``load * capacity * span / tokens``."""
    if load <= 0 or prefill_tok_s <= 0:
        raise ValueError("the load and the fleet's prefill capacity must be positive")
    tokens = sum(r.input_tokens for r in requests)
    span = requests[-1].t - requests[0].t if requests else 0.0
    if tokens == 0 or span <= 0:
        return 1.0
    return load * prefill_tok_s * span / tokens


def one_model(requests: Sequence[TraceRequest], model: str | None) -> tuple[list[TraceRequest], str]:
    """The requests a replay of one model sends, and that model: where the trace names several models
    (a recording of a gateway serving them), the requests of ``model``, or of the most requested one;
    else all of them as ``model`` (a generated or Mooncake trace names one, or none). Raises
    :class:`TraceError` for a ``model`` a trace of several models does not name: a replay runs one
    model's engines, and replaying every request as one model gave its numbers for all of them."""
    counts = Counter(r.model for r in requests)
    if len(counts) <= 1:
        name = model or (requests[0].model if requests else "replay")
        return with_model(requests, name), name
    named = ", ".join(f"{name} ({n} requests)" for name, n in counts.most_common())
    if model is None:
        model = counts.most_common(1)[0][0]
    elif model not in counts:
        raise TraceError(f"--model {model}: the trace names {named}, not {model}")
    return [r for r in requests if r.model == model], model


def with_model(requests: Sequence[TraceRequest], model: str) -> list[TraceRequest]:
    """Every request asking for ``model``."""
    return [replace(r, model=model) for r in requests]


def conversations(requests: Sequence[TraceRequest]) -> list[list[int]]:
    """Indices to send one after the other: one list per session, and one per conversation of
    session-less requests, where a request whose ``hash_ids`` start with all of an earlier one's
    (the last of its list) is that conversation's next turn: a client sends a turn after the
    previous one's answer, with or without a session id. Other requests stand alone."""
    by_session: dict[str, list[int]] = {}
    tails: dict[tuple[int, ...], list[int]] = {}  # the hash_ids of a conversation's latest turn -> its list
    out: list[list[int]] = []
    for index, request in enumerate(requests):
        if request.session is None:
            ids = request.hash_ids
            chain = next((tails.pop(ids[:n]) for n in range(len(ids), 0, -1) if ids[:n] in tails), None)
            if chain is None:
                chain = []
                out.append(chain)
            chain.append(index)
            if ids:
                tails[ids] = chain
        elif request.session in by_session:
            by_session[request.session].append(index)
        else:
            by_session[request.session] = [index]
            out.append(by_session[request.session])
    return out
