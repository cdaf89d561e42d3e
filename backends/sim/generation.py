"""Deterministic simulated model outputs: the same (seed, prompt tokens) always give the same answer.

A text answer is ``16 + h mod 33`` tokens of plausible words (``h`` a hash of seed and prompt) followed
by the end-of-turn token ``<|im_end|>``; it finishes with ``stop``. A tool call emits the text
``<tool_call>\\n{"name": N, "arguments": A}\\n</tool_call>`` then ``<|im_end|>`` and finishes with
``tool_calls``; ``A`` is JSON built from the tool's parameter schema (required properties, then the
others). Each output token carries the chat delta it produces when streamed: nothing, text, the tool
call header (the token that completes the name) or an arguments fragment.
"""

from __future__ import annotations

import hashlib
import json
import random
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backends.sim import tokenizer
from backends.sim.chat import tool_call_text

# fmt: off
WORDS = (
    "the", "model", "reads", "your", "code", "and", "then", "it", "writes", "a", "short", "plan",
    "before", "each", "change", "so", "that", "tests", "keep", "passing", "while", "the", "function",
    "returns", "values", "from", "cache", "when", "the", "request", "repeats", "a", "prefix", "we",
    "can", "reuse", "state", "across", "turns", "and", "measure", "latency", "per", "token", "for",
    "every", "stream", "on", "both", "engines", "here",
)
# fmt: on
MIN_TEXT_TOKENS = 16
TEXT_TOKEN_SPREAD = 33


class DeltaKind(StrEnum):
    """What a generated token adds to a streamed chat message."""

    NONE = "none"
    TEXT = "text"
    REASONING = "reasoning"  # a thinking model's reasoning, streamed before the answer
    TOOL_START = "tool_start"
    TOOL_ARGS = "tool_args"


@dataclass(frozen=True, slots=True)
class OutToken:
    """One generated token: its id, its text and the chat delta it produces."""

    id: int
    text: str
    kind: DeltaKind


@dataclass(frozen=True, slots=True)
class ToolCallPlan:
    """The tool call an answer makes; ``key`` is a deterministic random string for its id."""

    name: str
    arguments: str
    key: str


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """Everything the simulated model would say if never cut off."""

    tokens: tuple[OutToken, ...]
    tool_call: ToolCallPlan | None

    @property
    def natural_finish(self) -> str:
        """``tool_calls`` for a tool call, else ``stop``."""
        return "stop" if self.tool_call is None else "tool_calls"


def _rng(seed: int, prompt: Sequence[int]) -> random.Random:
    digest = hashlib.blake2b(array("I", prompt).tobytes(), digest_size=8, key=seed.to_bytes(8, "little"))
    return random.Random(int.from_bytes(digest.digest(), "little"))


def _text_tokens(rng: random.Random, n_tokens: int) -> list[OutToken]:
    out: list[OutToken] = []
    first = True
    while len(out) < n_tokens:
        word = rng.choice(WORDS)
        text = (word.capitalize() if first else " " + word) if rng.random() > 0.1 or first else ","
        first = False
        for piece in tokenizer.pieces(text):
            out.append(OutToken(tokenizer.piece_id(piece), piece, DeltaKind.TEXT))
    return out[:n_tokens]


def _value_for(schema: object, rng: random.Random) -> Any:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if isinstance(schema, Mapping) and isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    if kind == "integer":
        return rng.randint(1, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() > 0.5
    if kind == "array":
        return (
            [_value_for(schema.get("items", {}), rng) for _ in range(2)]
            if isinstance(schema, Mapping)
            else []
        )
    if kind == "object" and isinstance(schema, Mapping):
        return build_arguments(schema, rng)
    return " ".join(rng.choice(WORDS) for _ in range(2))


def build_arguments(schema: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    """An arguments object for a JSON schema: every property, required ones first."""
    properties = schema.get("properties") or {}
    if not isinstance(properties, Mapping):
        return {}
    required = [n for n in schema.get("required") or [] if n in properties]
    names = required + [n for n in properties if n not in required]
    return {name: _value_for(properties[name], rng) for name in names}


def _tool_tokens(function: Mapping[str, Any], rng: random.Random) -> tuple[list[OutToken], ToolCallPlan]:
    name = str(function["name"])
    params = function.get("parameters")
    arguments = json.dumps(build_arguments(params if isinstance(params, Mapping) else {}, rng))
    whole = tool_call_text(name, arguments)
    head, tail = whole.split(arguments, 1) if arguments in whole else (whole, "")
    out = [OutToken(tokenizer.piece_id(p), p, DeltaKind.NONE) for p in tokenizer.pieces(head)]
    out[-1] = OutToken(out[-1].id, out[-1].text, DeltaKind.TOOL_START)
    out += [OutToken(tokenizer.piece_id(p), p, DeltaKind.TOOL_ARGS) for p in tokenizer.pieces(arguments)]
    out += [OutToken(tokenizer.piece_id(p), p, DeltaKind.NONE) for p in tokenizer.pieces(tail)]
    key = "".join(
        rng.choice("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") for _ in range(32)
    )
    return out, ToolCallPlan(name, arguments, key)


def plan_output(
    seed: int,
    prompt: Sequence[int],
    tool: Mapping[str, Any] | None = None,
    *,
    ignore_eos_until: int | None = None,
    reasoning_tokens: int = 0,
) -> OutputPlan:
    """The full deterministic answer to ``prompt`` (see the module docstring).

    ``ignore_eos_until``: the request set ``ignore_eos`` (both engines accept it), so the text runs
    on for that many tokens instead of ending at its natural length.
    """
    rng = _rng(seed, prompt)
    eos = OutToken(tokenizer.EOS_ID, "", DeltaKind.NONE)
    thinking = (
        tuple(OutToken(t.id, t.text, DeltaKind.REASONING) for t in _text_tokens(rng, reasoning_tokens))
        if reasoning_tokens > 0
        else ()
    )
    if tool is not None:
        tokens, call = _tool_tokens(tool, rng)
        return OutputPlan((*thinking, *tokens, eos), call)
    n_text = MIN_TEXT_TOKENS + rng.randrange(TEXT_TOKEN_SPREAD)
    if ignore_eos_until is not None:
        n_text = max(n_text, ignore_eos_until)
    return OutputPlan((*thinking, *_text_tokens(rng, n_text), eos), None)


@dataclass(frozen=True, slots=True)
class Answer:
    """The part of a plan actually generated under a token budget, and why it ended."""

    tokens: tuple[OutToken, ...]
    finish_reason: str
    tool_call: ToolCallPlan | None

    @property
    def text(self) -> str:
        """The generated content text (``TEXT`` deltas only)."""
        return "".join(t.text for t in self.tokens if t.kind is DeltaKind.TEXT)

    @property
    def reasoning(self) -> str:
        """The reasoning streamed before the answer (``REASONING`` deltas only)."""
        return "".join(t.text for t in self.tokens if t.kind is DeltaKind.REASONING)

    @property
    def raw_text(self) -> str:
        """Everything generated, as text (what ``/v1/completions`` returns)."""
        return "".join(t.text for t in self.tokens)

    @property
    def arguments(self) -> str:
        """The streamed part of the tool call's arguments."""
        return "".join(t.text for t in self.tokens if t.kind is DeltaKind.TOOL_ARGS)


def cut(plan: OutputPlan, max_tokens: int | None) -> Answer:
    """Truncate ``plan`` to ``max_tokens``: ``length`` when that drops tokens, else the natural finish."""
    if max_tokens is not None and max_tokens < len(plan.tokens):
        tokens = plan.tokens[: max(max_tokens, 0)]
        started = any(t.kind is DeltaKind.TOOL_START for t in tokens)
        return Answer(tokens, "length", plan.tool_call if started else None)
    return Answer(plan.tokens, plan.natural_finish, plan.tool_call)
