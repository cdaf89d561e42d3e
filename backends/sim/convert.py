"""Anthropic Messages and OpenAI Responses request bodies -> OpenAI chat bodies, as each engine converts them.

llama.cpp (``tools/server/server-chat.cpp``):

* ``server_chat_convert_anthropic_to_oai`` builds a **new** body: ``messages`` (``system`` first, text
  blocks concatenated), ``tools`` (``input_schema`` -> ``parameters``), ``tool_choice`` (``any``/``tool``
  -> ``required``), ``max_tokens`` (default 4096) and ``stream``. Every other key, ``id_slot`` and
  ``cache_prompt`` included, is dropped: ``/v1/messages`` cannot pin a slot. A missing ``messages`` is a
  ``std::runtime_error`` (500 ``server_error``).
* ``server_chat_convert_responses_to_chatcmpl`` **copies** the body and swaps ``input``/``instructions``
  for ``messages``, flat tools for chat tools and ``max_output_tokens`` for ``max_tokens``, so
  ``id_slot``, ``cache_prompt`` and ``n_predict`` pass through.

vLLM (``entrypoints/anthropic/serving.py``, ``entrypoints/openai/responses``) converts the same fields;
tool-use inputs are re-serialised with ``json.dumps`` rather than compact JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from backends.sim.chat import InvalidChat


class ServerError(RuntimeError):
    """llama.cpp raised a plain ``std::runtime_error``: 500 ``server_error``."""


def _dump(value: Any, llama: bool) -> str:
    return json.dumps(value, separators=(",", ":") if llama else None, ensure_ascii=not llama)


def _system_text(system: object) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "".join(
            str(b.get("text", ""))
            for b in system
            if isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    return None


def _tool_result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(c.get("text", "")) for c in content if isinstance(c, Mapping) and c.get("type") == "text"
        )
    return ""


def _anthropic_message(msg: Mapping[str, Any], llama: bool) -> list[dict[str, Any]]:
    role = msg.get("role")
    content = msg.get("content")
    if not isinstance(content, list):
        return [dict(msg)]
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append({"type": "text", "text": block["text"]})
        elif kind == "tool_use":
            arguments = _dump(block.get("input") or {}, llama)
            function = {"name": str(block.get("name") or ""), "arguments": arguments}
            calls.append({"id": str(block.get("id") or ""), "type": "function", "function": function})
        elif kind == "tool_result":
            text = _tool_result_text(block.get("content"))
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
    out: list[dict[str, Any]] = []
    if texts or calls:
        message: dict[str, Any] = {"role": role, "content": texts or ""}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out + results


def _anthropic_tools(tools: object) -> list[dict[str, Any]] | None:
    if not isinstance(tools, list):
        return None
    out = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            raise InvalidChat("each tool must be an object", "tools")
        function = {
            "name": str(tool.get("name") or ""),
            "description": str(tool.get("description") or ""),
            "parameters": tool.get("input_schema") or {},
        }
        out.append({"type": "function", "function": function})
    return out


def _anthropic_tool_choice(choice: object, llama: bool) -> Any:
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if kind == "auto":
        return "auto"
    if kind == "any" or (kind == "tool" and llama):
        return "required"
    if kind == "none" and not llama:
        return "none"
    if kind == "tool" and isinstance(choice, Mapping):
        return {"type": "function", "function": {"name": choice.get("name")}}
    return None


def anthropic_to_chat(body: Mapping[str, Any], llama: bool) -> dict[str, Any]:
    """The chat body an Anthropic Messages (or count_tokens) body becomes (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    system = _system_text(body.get("system"))
    if system is not None and (llama or system):
        messages.append({"role": "system", "content": system})
    if "messages" not in body:
        if llama:
            raise ServerError("'messages' is required")
        raise InvalidChat("Field required", "messages")
    raw = body["messages"]
    if not isinstance(raw, list):
        raise InvalidChat("'messages' must be an array", "messages")
    for msg in raw:
        if not isinstance(msg, Mapping):
            raise InvalidChat("each message must be an object", "messages")
        messages.extend(_anthropic_message(msg, llama))
    chat: dict[str, Any] = {"messages": messages}
    tools = _anthropic_tools(body.get("tools"))
    if tools is not None:
        chat["tools"] = tools
    choice = _anthropic_tool_choice(body.get("tool_choice"), llama)
    if choice is not None:
        chat["tool_choice"] = choice
    chat["max_tokens"] = body.get("max_tokens", 4096)
    if "stream" in body:
        chat["stream"] = body["stream"]
    if not llama and "model" in body:
        chat["model"] = body["model"]
    return chat


def _input_item(item: Mapping[str, Any], messages: list[dict[str, Any]]) -> None:
    merge = bool(messages) and messages[-1].get("role") == "assistant"
    kind, role, content = item.get("type"), item.get("role"), item.get("content")
    if isinstance(content, str):
        content = [{"type": "input_text", "text": content}]
    if isinstance(content, list) and role in ("user", "system", "developer"):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "input_text" or "text" not in part:
                raise InvalidChat(
                    "'type' must be one of 'input_text', 'input_image', or 'input_file'", "input"
                )
            parts.append({"type": "text", "text": part["text"]})
        messages.append({"role": role, "content": parts})
    elif role == "assistant" and kind == "message":
        parts = [
            {"type": "text", "text": p["text"]}
            for p in content or []
            if isinstance(p, Mapping) and p.get("type") in ("output_text", "input_text")
        ]
        if merge:
            previous = messages[-1].get("content")
            messages[-1]["content"] = (previous if isinstance(previous, list) else []) + parts
        else:
            messages.append({"role": "assistant", "content": parts})
    elif kind == "function_call" and all(
        isinstance(item.get(k), str) for k in ("arguments", "call_id", "name")
    ):
        call = {
            "function": {"arguments": item["arguments"], "name": item["name"]},
            "id": item["call_id"],
            "type": "function",
        }
        if merge:
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "tool_calls": [call]})
    elif kind == "function_call_output" and isinstance(item.get("call_id"), str):
        output = item.get("output")
        text = output if isinstance(output, str) else _tool_result_text(output)
        messages.append({"content": text, "role": "tool", "tool_call_id": item["call_id"]})
    else:
        raise InvalidChat("Cannot determine type of 'item'", "input")


def responses_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat body a Responses body becomes: the body itself with ``messages``, chat ``tools`` and
    ``max_tokens`` in place of ``input``/``instructions``, flat tools and ``max_output_tokens``."""
    if "input" not in body:
        raise InvalidChat("'input' is required", "input")
    chat = {k: v for k, v in body.items() if k not in ("input", "instructions", "tools", "max_output_tokens")}
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        instructions = body["instructions"]
        messages.append({"role": "system", "content": instructions if isinstance(instructions, str) else ""})
    value = body["input"]
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        for item in value:
            if not isinstance(item, Mapping):
                raise InvalidChat("Cannot determine type of 'item'", "input")
            _input_item(item, messages)
    else:
        raise InvalidChat("'input' must be a string or array of objects", "input")
    chat["messages"] = messages
    if "tools" in body:
        if not isinstance(body["tools"], list):
            raise InvalidChat("'tools' must be an array of objects", "tools")
        tools = []
        for tool in body["tools"]:
            if isinstance(tool, Mapping) and tool.get("type") == "function":
                function = {k: v for k, v in tool.items() if k != "type"}
                function.setdefault("strict", True)
                tools.append({"type": "function", "function": function})
        if tools:
            chat["tools"] = tools
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    return chat
