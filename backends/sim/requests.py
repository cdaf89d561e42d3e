"""Parsing of generation request bodies shared by both simulators (pure: dict in, dataclass out)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backends.sim import tokenizer
from backends.sim.chat import InvalidChat, chosen_tool, render_chat, render_parts


class Endpoint(StrEnum):
    """Which OpenAI endpoint a request came in on."""

    CHAT = "chat"
    COMPLETION = "completion"


@dataclass(frozen=True, slots=True)
class GenRequest:
    """What the simulators need from a chat or completion request."""

    endpoint: Endpoint
    model: str | None
    prompt: list[int]
    max_tokens: int | None
    stream: bool
    stream_options: Mapping[str, Any] | None
    tool: Mapping[str, Any] | None
    named_tool: bool
    id_slot: int
    cache_prompt: bool
    ignore_eos: bool = False
    user_start: int = -1
    """Where the chat prompt's last user message starts (a token index; -1: none): llama-server ends
    a prefill step there (``EngineProfile.step_tokens``)."""
    first_user: int = -1
    """Where its first user message starts (-1: none): llama-server checkpoints it on a cold prompt."""

    @property
    def include_usage(self) -> bool:
        """``stream_options.include_usage``."""
        return bool(self.stream_options and self.stream_options.get("include_usage"))


def _int_field(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidChat(f"'{name}' must be an integer", name)
    return value


def _max_tokens(body: Mapping[str, Any], llama: bool) -> int | None:
    """``n_predict`` (llama.cpp only, wins) > ``max_completion_tokens`` > ``max_tokens``; -1 means none."""
    names = (
        ("n_predict", "max_completion_tokens", "max_tokens")
        if llama
        else ("max_completion_tokens", "max_tokens")
    )
    for name in names:
        value = _int_field(body, name)
        if value is not None:
            return None if llama and value < 0 else value
    return None


def _prompt_tokens(
    body: Mapping[str, Any], endpoint: Endpoint
) -> tuple[list[int], Mapping[str, Any] | None, int, int]:
    """The prompt's tokens, the tool a chat names, and where its last and first user messages start."""
    if endpoint is Endpoint.CHAT:
        messages = body.get("messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise InvalidChat("'tools' must be a list", "tools")
        if not isinstance(messages, list):
            raise InvalidChat("'messages' must be a non-empty list", "messages")
        text = render_chat(messages, tools)
        last, first = user_starts(messages, tools)  # a tool message is no user message
        return (
            tokenizer.encode(text),
            chosen_tool(messages, tools, body.get("tool_choice", "auto")),
            last,
            first,
        )
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt), None, -1, -1
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        if not all(0 <= t < tokenizer.N_VOCAB for t in prompt):  # both engines refuse these with a 400
            raise InvalidChat(f"'prompt' token ids must be in [0, {tokenizer.N_VOCAB})", "prompt")
        return [int(t) for t in prompt], None, -1, -1
    raise InvalidChat("'prompt' must be a string or a list of token ids", "prompt")


def user_starts(messages: list[Any], tools: Any) -> tuple[int, int]:
    """Where the last and the first user message start in the rendered chat, in tokens (-1: none); one
    that starts it is none (position 0: llama-server looks for a user message's start only after a
    token is in, so the first it can break at on a cold prompt is the next one, ``policies.checkpoints``)."""
    head, parts = render_parts(messages, tools)
    at, starts = tokenizer.count(head), []
    for index, part in parts:
        message = messages[index]
        if at > 0 and isinstance(message, Mapping) and message.get("role") == "user":
            starts.append(at)
        at += tokenizer.count(part)
    return (starts[-1], starts[0]) if starts else (-1, -1)


def parse_request(body: Mapping[str, Any], endpoint: Endpoint, *, llama: bool) -> GenRequest:
    """Validate and digest a request body; raises :class:`InvalidChat` naming the bad field."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidChat("'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise InvalidChat("'stream_options' must be an object", "stream_options")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidChat("'model' must be a string", "model")
    prompt, tool, user_start, first_user = _prompt_tokens(body, endpoint)
    id_slot = _int_field(body, "id_slot") if llama else None
    cache_prompt = body.get("cache_prompt", True)
    return GenRequest(
        endpoint=endpoint,
        model=model,
        prompt=prompt,
        max_tokens=_max_tokens(body, llama),
        stream=stream,
        stream_options=options,
        tool=tool,
        named_tool=isinstance(body.get("tool_choice"), Mapping),
        id_slot=-1 if id_slot is None else id_slot,
        cache_prompt=cache_prompt is not False,
        ignore_eos=body.get("ignore_eos") is True,
        user_start=user_start,
        first_user=first_user,
    )
