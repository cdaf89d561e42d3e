"""Comparing two engines' answers by shape: keys, JSON types and event sequences, not values."""

from __future__ import annotations

import json
from typing import Any


def shape(value: Any) -> Any:
    """A value's structure: objects keep their keys, arrays the shape of their first item."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return type(value).__name__


def differences(real: Any, sim: Any, path: str = "$") -> list[str]:
    """Where ``sim``'s shape differs from ``real``'s, one line per difference."""
    if isinstance(real, dict) and isinstance(sim, dict):
        found = [f"{path}.{k}: missing in simulator" for k in real if k not in sim]
        found += [f"{path}.{k}: only in simulator" for k in sim if k not in real]
        for key in real.keys() & sim.keys():
            found += differences(real[key], sim[key], f"{path}.{key}")
        return found
    if isinstance(real, list) and isinstance(sim, list):
        if real and sim:
            return differences(real[0], sim[0], f"{path}[0]")
        return []
    if real != sim:
        return [f"{path}: real {real!r}, simulator {sim!r}"]
    return []


def sse_payloads(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body (UTF-8: llama-server sends no charset)."""
    payloads = []
    for event in raw.decode("utf-8").split("\n\n"):
        data = [line[5:].strip() for line in event.splitlines() if line.startswith("data:")]
        if data:
            payloads.append("\n".join(data))
    return payloads


def chat_event_kinds(raw: bytes) -> list[str]:
    """An OpenAI chat stream as a sequence of kinds: role, content, tool, finish, usage, done, error."""
    kinds: list[str] = []
    for payload in sse_payloads(raw):
        if payload == "[DONE]":
            kinds.append("done")
            continue
        data = json.loads(payload)
        if "error" in data:
            kinds.append("error")
        elif not data.get("choices"):
            kinds.append("usage")
        else:
            choice = data["choices"][0]
            delta = choice.get("delta", {})
            if choice.get("finish_reason"):
                kinds.append("finish")
            elif "role" in delta:
                kinds.append("role")
            elif delta.get("tool_calls"):
                kinds.append("tool")
            else:
                kinds.append("content")
    collapsed: list[str] = []
    for kind in kinds:  # runs of content/tool deltas count once: lengths differ by model
        if not (collapsed and kind in ("content", "tool") and collapsed[-1] == kind):
            collapsed.append(kind)
    return collapsed


def named_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The ``event:``/``data:`` pairs of a named-event SSE body (Anthropic Messages, OpenAI Responses)."""
    out = []
    for block in raw.decode("utf-8").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def collapsed(names: list[str]) -> list[str]:
    """Event names with runs of the same delta event counted once (lengths differ by model)."""
    out: list[str] = []
    for name in names:
        if not (out and name == out[-1] and name.endswith("delta")):
            out.append(name)
    return out
