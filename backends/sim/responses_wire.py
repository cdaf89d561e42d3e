"""OpenAI Responses bodies and SSE events of both engines, key for key (pure: task in, dicts out).

llama.cpp (``server-task.cpp`` ``to_json_oaicompat_resp*``): a small ``response`` object (usage
``{input_tokens, output_tokens, total_tokens, input_tokens_details{cached_tokens}}``);
``response.created`` + ``response.in_progress`` ride on the first generated token, items open on their
first delta, and the final result sends the ``...done`` events then ``response.completed`` with
``timings`` beside ``response``. No ``sequence_number``, no ``function_call_arguments.done``.

vLLM (``entrypoints/openai/responses``, simple non-harmony path): the full ``ResponsesResponse`` echo
(``model_dump``), events numbered by ``sequence_number``, ``created``/``in_progress`` before the queue
wait, one item open at a time, and ``function_call_arguments.done`` before a call's ``output_item.done``.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from backends.sim import llama_wire
from backends.sim.generation import DeltaKind, OutToken
from backends.sim.task import SimTask

Event = tuple[str, dict[str, Any]]
_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def llama_random() -> str:
    """``random_string()``: 32 alphanumerics."""
    return "".join(secrets.choice(_ALNUM) for _ in range(32))


def _text_part(text: str, logprobs: Any) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": logprobs, "text": text}


# --- llama.cpp -------------------------------------------------------------------------------------


def llama_usage(task: SimTask) -> dict[str, Any]:
    """Full prompt, output, total and ``cached_tokens``."""
    n_prompt, n_out = len(task.prompt), task.n_emitted
    return {
        "input_tokens": n_prompt,
        "output_tokens": n_out,
        "total_tokens": n_prompt + n_out,
        "input_tokens_details": {"cached_tokens": task.cached},
    }


def _llama_call_item(task: SimTask, status: str) -> dict[str, Any] | None:
    call = task.answer.tool_call
    if call is None:
        return None
    return {
        "id": "fc_" + call.key, "type": "function_call", "status": status,
        "arguments": task.answer.arguments, "call_id": "call_" + call.key, "name": call.name,
    }  # fmt: skip


def llama_response(task: SimTask, resp_id: str, model: str) -> dict[str, Any]:
    """Non-streamed ``to_json_oaicompat_resp``."""
    output: list[dict[str, Any]] = []
    if task.answer.text:
        content = [{"type": "output_text", "annotations": [], "logprobs": [], "text": task.answer.text}]
        output.append(
            {"content": content, "id": "msg_" + llama_random(), "role": "assistant", "status": "completed",
             "type": "message"}
        )  # fmt: skip
    call = _llama_call_item(task, "completed")
    if call is not None:
        output.append(call)
    now = int(time.time())
    return {
        "completed_at": now, "created_at": now, "id": resp_id, "model": model, "object": "response",
        "output": output, "status": "completed", "usage": llama_usage(task),
    }  # fmt: skip


class LlamaResponseStream:
    """``to_json_oaicompat_resp`` of each partial and ``to_json_oaicompat_resp_stream`` of the final."""

    def __init__(self, task: SimTask, resp_id: str, model: str) -> None:
        self.task, self.resp_id, self.model = task, resp_id, model
        self.msg_id = "msg_" + llama_random()
        self.created = False
        self.text_started = False

    def token(self, token: OutToken) -> list[Event]:
        """The events of one generated token."""
        events: list[Event] = []
        if not self.created:
            self.created = True
            head = {"id": self.resp_id, "object": "response", "status": "in_progress"}
            events.append(("response.created", {"type": "response.created", "response": head}))
            events.append(("response.in_progress", {"type": "response.in_progress", "response": dict(head)}))
        call = self.task.answer.tool_call
        if token.kind is DeltaKind.TEXT and token.text:
            if not self.text_started:
                self.text_started = True
                item = {
                    "content": [],
                    "id": self.msg_id,
                    "role": "assistant",
                    "status": "in_progress",
                    "type": "message",
                }
                events.append(
                    ("response.output_item.added", {"type": "response.output_item.added", "item": item})
                )
                part = {"type": "output_text", "text": ""}
                data = {"type": "response.content_part.added", "item_id": self.msg_id, "part": part}
                events.append(("response.content_part.added", data))
            data = {"type": "response.output_text.delta", "item_id": self.msg_id, "delta": token.text}
            events.append(("response.output_text.delta", data))
        elif token.kind is DeltaKind.TOOL_START and call is not None:
            item = {
                "id": "fc_" + call.key, "arguments": "", "call_id": "call_" + call.key, "name": call.name,
                "type": "function_call", "status": "in_progress",
            }  # fmt: skip
            events.append(
                ("response.output_item.added", {"type": "response.output_item.added", "item": item})
            )
        elif token.kind is DeltaKind.TOOL_ARGS and token.text and call is not None:
            name = "response.function_call_arguments.delta"
            events.append((name, {"type": name, "delta": token.text, "item_id": "fc_" + call.key}))
        return events

    def done(self) -> list[Event]:
        """The ``...done`` events and ``response.completed`` (with ``timings``)."""
        events: list[Event] = []
        output: list[dict[str, Any]] = []
        text = self.task.answer.text
        if text:
            events.append(
                ("response.output_text.done",
                 {"type": "response.output_text.done", "item_id": self.msg_id, "text": text})
            )  # fmt: skip
            part = _text_part(text, [])
            data = {"type": "response.content_part.done", "item_id": self.msg_id, "part": part}
            events.append(("response.content_part.done", data))
            item = {
                "type": "message",
                "status": "completed",
                "id": self.msg_id,
                "content": [part],
                "role": "assistant",
            }
            events.append(("response.output_item.done", {"type": "response.output_item.done", "item": item}))
            output.append(item)
        call = _llama_call_item(self.task, "completed")
        if call is not None:
            events.append(("response.output_item.done", {"type": "response.output_item.done", "item": call}))
            output.append(call)
        response = {
            "id": self.resp_id, "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": self.model, "output": output, "usage": llama_usage(self.task),
        }  # fmt: skip
        completed = {
            "type": "response.completed",
            "response": response,
            "timings": llama_wire.timings(self.task),
        }
        events.append(("response.completed", completed))
        return events


# --- vLLM ------------------------------------------------------------------------------------------


def vllm_id(prefix: str) -> str:
    """``<prefix>_<16 hex>`` as vLLM's ``random_uuid`` ids."""
    return f"{prefix}_{secrets.token_hex(8)}"


def _vllm_part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def vllm_message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """``ResponseOutputMessage`` (no content part for empty text)."""
    content: list[dict[str, Any]] = [_vllm_part(text, None)] if text else []
    return {
        "id": item_id,
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def vllm_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    """``ResponseFunctionToolCall``."""
    return {
        "arguments": arguments, "call_id": call_id, "name": name, "type": "function_call", "id": item_id,
        "async": None, "caller": None, "namespace": None, "status": status,
    }  # fmt: skip


def vllm_output(task: SimTask, call_id: str) -> list[dict[str, Any]]:
    """The non-streamed output items: a message if there is text, then the tool call."""
    out = [vllm_message_item(vllm_id("msg"), task.answer.text, "completed")] if task.answer.text else []
    call = task.answer.tool_call
    if call is not None:
        out.append(vllm_call_item(vllm_id("fc"), call_id, call.name, task.answer.arguments, "completed"))
    return out


class VllmResponseStream:
    """``SimpleStreamingEventProcessor``: items open and close one at a time; events are numbered."""

    def __init__(self, task: SimTask, call_id: str) -> None:
        self.task, self.call_id = task, call_id
        self.seq = 0
        self.index = 0
        self.open: str | None = None
        self.item_id = ""
        self.text = ""
        self.items: list[dict[str, Any]] = []

    def event(self, name: str, data: dict[str, Any]) -> Event:
        """Number an event; the SDK models list their keys alphabetically, except ``name`` (last)."""
        fields = dict(data) | {"sequence_number": self.seq, "type": name}
        out = {key: fields[key] for key in sorted(fields) if key != "name"}
        if "name" in fields:
            out["name"] = fields["name"]
        self.seq += 1
        return name, out

    def _close(self) -> list[Event]:
        events: list[Event] = []
        where = {"output_index": self.index}
        if self.open == "text":
            ids = {"content_index": 0, "item_id": self.item_id}
            events.append(
                self.event(
                    "response.output_text.done",
                    ids | {"logprobs": [], "output_index": self.index, "text": self.text},
                )
            )
            part = _vllm_part(self.text, None)
            events.append(self.event("response.content_part.done", ids | where | {"part": part}))
            item = vllm_message_item(self.item_id, self.text, "completed")
        elif self.open == "tool" and self.task.answer.tool_call is not None:
            name = self.task.answer.tool_call.name
            data = {"arguments": self.text, "item_id": self.item_id} | where | {"name": name}
            events.append(self.event("response.function_call_arguments.done", data))
            item = vllm_call_item(self.item_id, self.call_id, name, self.text, "completed")
        else:
            return events
        events.append(self.event("response.output_item.done", {"item": item} | where))
        self.items.append(item)
        self.open, self.text = None, ""
        self.index += 1
        return events

    def token(self, token: OutToken) -> list[Event]:
        """The events of one token's delta."""
        events: list[Event] = []
        call = self.task.answer.tool_call
        where = {"output_index": self.index}
        if token.kind is DeltaKind.TEXT and token.text:
            if self.open != "text":
                events += self._close()
                self.open, self.item_id = "text", vllm_id("msg")
                where = {"output_index": self.index}
                item = vllm_message_item(self.item_id, "", "in_progress")
                events.append(self.event("response.output_item.added", {"item": item} | where))
                part = _vllm_part("", [])
                data = {"content_index": 0, "item_id": self.item_id} | where | {"part": part}
                events.append(self.event("response.content_part.added", data))
            self.text += token.text
            data = {"content_index": 0, "delta": token.text, "item_id": self.item_id, "logprobs": []} | where
            events.append(self.event("response.output_text.delta", data))
        elif token.kind is DeltaKind.TOOL_START and call is not None:
            events += self._close()
            self.open, self.item_id = "tool", vllm_id("fc")
            item = vllm_call_item(self.item_id, self.call_id, call.name, "", "in_progress")
            events.append(
                self.event("response.output_item.added", {"item": item, "output_index": self.index})
            )
        elif token.kind is DeltaKind.TOOL_ARGS and token.text and self.open == "tool":
            self.text += token.text
            data = {"delta": token.text, "item_id": self.item_id, "output_index": self.index}
            events.append(self.event("response.function_call_arguments.delta", data))
        return events

    def done(self, response: dict[str, Any]) -> list[Event]:
        """Close the open item, then ``response.completed`` carrying the streamed items."""
        events = self._close()
        response["output"] = self.items
        events.append(self.event("response.completed", {"response": response}))
        return events
