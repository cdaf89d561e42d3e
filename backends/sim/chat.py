"""ChatML rendering of OpenAI chat requests (Qwen-style tool calling), shared by both simulators.

Layout, with ``S = <|im_start|>`` and ``E = <|im_end|>``::

    S system\\n{system text}[tools block]E\\n      (only if there is a system message or tools)
    S user\\n{text}E\\n
    S assistant\\n{text}[<tool_call>\\n{"name": N, "arguments": A}\\n</tool_call>]E\\n
    S user\\n<tool_response>\\n{text}\\n</tool_response>E\\n   (a ``tool`` message)
    S assistant\\n                                  (the generation prompt)

Content given as a list of parts joins the ``text`` parts with ``\\n``. An assistant turn renders exactly
the text the simulators generate for it, so a conversation that replays the answers verbatim only
appends to the previous prompt's tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from backends.sim.tokenizer import IM_END, IM_START

DEFAULT_SYSTEM = "You are a helpful assistant."
TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)


class InvalidChat(ValueError):
    """A chat request whose messages or tools cannot be rendered; ``param`` names the bad field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def content_text(content: object, where: str) -> str:
    """The text of a message ``content``: a string, null, or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise InvalidChat(f"unsupported content part in {where}", where)
            texts.append(str(part["text"]))
        return "\n".join(texts)
    raise InvalidChat(f"'content' of {where} must be a string or a list of parts", where)


def tool_call_text(name: str, arguments: str) -> str:
    """The generated text of one tool call (what the model emits, and how history renders it)."""
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n</tool_call>'


def _assistant_body(message: Mapping[str, Any], where: str) -> str:
    text = content_text(message.get("content"), where)
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise InvalidChat(f"'tool_calls' of {where} must be a list", where)
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidChat(f"bad tool call in {where}", where)
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        text += ("\n" if text else "") + tool_call_text(function["name"], arguments)
    return text


def _tools_block(tools: Sequence[Any]) -> str:
    lines = "".join("\n" + json.dumps(tool, sort_keys=False) for tool in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def render_chat(
    messages: Sequence[Any], tools: Sequence[Any] | None = None, add_generation_prompt: bool = True
) -> str:
    """Render ``messages`` (and ``tools``) as the ChatML prompt string described in the module docstring."""
    head, parts = render_parts(messages, tools)
    return (
        head
        + "".join(part for _, part in parts)
        + (f"{IM_START}assistant\n" if add_generation_prompt else "")
    )


def render_parts(
    messages: Sequence[Any], tools: Sequence[Any] | None = None
) -> tuple[str, list[tuple[int, str]]]:
    """``render_chat`` in parts: what comes before the messages (a leading system message and the tools
    block; "" for none), then each other message's index and text. Each part starts with a special
    token, so the prompt's tokens are the parts' tokens end to end."""
    if isinstance(messages, str | bytes) or not messages:
        raise InvalidChat("'messages' must be a non-empty list", "messages")
    first = 0
    system_text: str | None = None
    head = messages[0]
    if isinstance(head, Mapping) and head.get("role") in ("system", "developer"):
        system_text = content_text(head.get("content"), "messages[0]")
        first = 1
    prefix = ""
    if tools:
        prefix = f"{IM_START}system\n{system_text or DEFAULT_SYSTEM}{_tools_block(tools)}{IM_END}\n"
    elif system_text is not None:
        prefix = f"{IM_START}system\n{system_text}{IM_END}\n"
    return prefix, [(i, _render_message(messages[i], f"messages[{i}]")) for i in range(first, len(messages))]


def _render_message(message: object, where: str) -> str:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise InvalidChat(f"{where} must be an object with a 'role'", where)
    role = message["role"]
    if role == "assistant":
        return f"{IM_START}assistant\n{_assistant_body(message, where)}{IM_END}\n"
    if role == "tool":
        text = content_text(message.get("content"), where)
        return f"{IM_START}user\n<tool_response>\n{text}\n</tool_response>{IM_END}\n"
    if role in ("user", "system", "developer"):
        return f"{IM_START}{role}\n{content_text(message.get('content'), where)}{IM_END}\n"
    raise InvalidChat(f"unknown role '{role}' in {where}", where)


def chosen_tool(
    messages: Sequence[Any], tools: Sequence[Any] | None, tool_choice: object
) -> Mapping[str, Any] | None:
    """The tool the simulated model calls, or None for a text answer.

    It calls one when ``tools`` is non-empty, ``tool_choice`` is not ``"none"`` and the last message is
    from the user: the function named by ``tool_choice`` (``{"type":"function","function":{"name":..}}``)
    or else the first tool. After a ``tool`` message the model answers in text.
    """
    if not tools or tool_choice == "none" or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, Mapping) or last.get("role") != "user":
        return None
    candidates = [t.get("function") for t in tools if isinstance(t, Mapping)]
    functions: list[Mapping[str, Any]] = [
        f for f in candidates if isinstance(f, Mapping) and isinstance(f.get("name"), str)
    ]
    if not functions:
        return None
    if isinstance(tool_choice, Mapping):
        wanted = tool_choice.get("function", {})
        name = wanted.get("name") if isinstance(wanted, Mapping) else None
        for function in functions:
            if function["name"] == name:
                return function
    return functions[0]
