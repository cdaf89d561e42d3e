"""vLLM 0.32 OpenAI-server JSON bodies, key for key (``entrypoints/openai/*/protocol.py`` + ``serving.py``).

Non-streamed bodies are ``model_dump()`` (every field, nulls included); stream chunks are
``model_dump_json(exclude_unset=True)`` (only fields the server set); the usage chunk also drops nulls.
"""

from __future__ import annotations

import hashlib
from typing import Any

from backends.sim.generation import DeltaKind, OutToken
from backends.sim.task import SimTask

VERSION = "0.32.0"
FINGERPRINT = f"vllm-{VERSION}-5a1e0c3b"
SSE_DONE = b"data: [DONE]\n\n"


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict[str, Any]:
    """``ErrorResponse``: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(
    task: SimTask, details: bool, *, drop_none: bool = False, created: int | None = None
) -> dict[str, Any]:
    """``UsageInfo``; ``prompt_tokens_details`` only with ``--enable-prompt-tokens-details``.

    ``created`` is ``created_cache_tokens`` (prompt tokens this request newly wrote to the prefix
    cache): the chat endpoint sets it, the completions endpoint leaves it null.
    """
    out: dict[str, Any] = {
        "prompt_tokens": len(task.prompt),
        "total_tokens": len(task.prompt) + task.n_emitted,
        "completion_tokens": task.n_emitted,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    if details:
        ptd: dict[str, Any] = {
            "cached_tokens": task.cached,
            "created_cache_tokens": created,
            "multimodal_tokens": None,
        }
        out["prompt_tokens_details"] = ptd
    if drop_none:
        out = {k: v for k, v in out.items() if v is not None}
        if details:
            out["prompt_tokens_details"] = {k: v for k, v in ptd.items() if v is not None}
    return out


def tool_call_id(task: SimTask) -> str:
    """``chatcmpl-tool-<32 hex>``, derived from the answer so it is stable."""
    key = task.answer.tool_call.key if task.answer.tool_call else task.id
    return "chatcmpl-tool-" + hashlib.md5(key.encode(), usedforsecurity=False).hexdigest()


def chat_message(task: SimTask) -> dict[str, Any]:
    """``ChatMessage.model_dump()``; ``tool_calls`` is dropped when empty, content is null for a call."""
    call = task.answer.tool_call
    message: dict[str, Any] = {
        "role": "assistant",
        "content": task.answer.text if call is None else (task.answer.text or None),
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if call is not None:
        function = {"name": call.name, "arguments": task.answer.arguments}
        message["tool_calls"] = [{"id": tool_call_id(task), "type": "function", "function": function}]
    message["reasoning"] = task.answer.reasoning or None
    return message


def finish_reason(task: SimTask, named_tool: bool) -> str:
    """vLLM reports ``stop`` (not ``tool_calls``) for a call forced by a named ``tool_choice``."""
    reason = task.answer.finish_reason
    return "stop" if reason == "tool_calls" and named_tool else reason


def chat_response(
    task: SimTask,
    req_id: str,
    model: str,
    created: int,
    details: bool,
    named_tool: bool,
    created_cache: int | None = None,
) -> dict[str, Any]:
    """Non-streamed ``chat.completion`` (``created_cache``: its ``created_cache_tokens``)."""
    choice = {
        "index": 0,
        "message": chat_message(task),
        "logprobs": None,
        "finish_reason": finish_reason(task, named_tool),
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
    }
    return {
        "id": req_id, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
        "service_tier": None, "system_fingerprint": FINGERPRINT,
        "usage": usage(task, details, created=created_cache), "prompt_logprobs": None,
        "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
        "ec_transfer_params": None, "metrics": None,
    }  # fmt: skip


def _chunk(req_id: str, model: str, created: int, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": req_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }


def role_chunk(req_id: str, model: str, created: int) -> dict[str, Any]:
    """First chunk: ``delta {"role":"assistant","content":""}`` plus the explicitly-set null fields."""
    choice = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    out = _chunk(req_id, model, created, [choice])
    out["prompt_token_ids"] = None
    out["prompt_text"] = None
    return out


def token_delta(task: SimTask, token: OutToken) -> dict[str, Any] | None:
    """The hermes-style parser's delta for one token (None: nothing to send yet)."""
    call = task.answer.tool_call
    if token.kind is DeltaKind.TEXT:
        return {"content": token.text}
    if token.kind is DeltaKind.REASONING:
        return {"reasoning": token.text}
    if token.kind is DeltaKind.TOOL_START and call is not None:
        return {
            "tool_calls": [
                {"id": tool_call_id(task), "type": "function", "index": 0, "function": {"name": call.name}}
            ]
        }
    if token.kind is DeltaKind.TOOL_ARGS:
        return {"tool_calls": [{"index": 0, "function": {"arguments": token.text}}]}
    return None


def token_chunk(
    delta: dict[str, Any], req_id: str, model: str, created: int, finish: str | None, fingerprint: bool
) -> dict[str, Any]:
    """A content chunk; the finishing one carries ``finish_reason``/``stop_reason`` (and the fingerprint
    when no usage chunk follows)."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    choice["token_ids"] = None
    out = _chunk(req_id, model, created, [choice])
    if finish is not None and fingerprint:
        out["system_fingerprint"] = FINGERPRINT
    return out


def usage_chunk(
    task: SimTask,
    req_id: str,
    model: str,
    created: int,
    details: bool,
    *,
    chat: bool,
    created_cache: int | None = None,
) -> dict[str, Any]:
    """The ``include_usage`` chunk: ``choices: []``, usage without nulls, fingerprint."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {
        "id": req_id, "object": kind, "created": created, "model": model, "choices": [],
        "usage": usage(task, details, drop_none=True, created=created_cache),
        "system_fingerprint": FINGERPRINT,
    }  # fmt: skip


def completion_response(
    task: SimTask, req_id: str, model: str, created: int, details: bool
) -> dict[str, Any]:
    """Non-streamed ``text_completion``."""
    choice = {
        "index": 0, "text": task.answer.raw_text, "logprobs": None,
        "finish_reason": task.answer.finish_reason, "stop_reason": None, "token_ids": None,
        "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None,
    }  # fmt: skip
    return {
        "id": req_id, "object": "text_completion", "created": created, "model": model, "choices": [choice],
        "service_tier": None, "system_fingerprint": FINGERPRINT, "usage": usage(task, details),
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
    }  # fmt: skip


def completion_chunk(
    text: str, req_id: str, model: str, created: int, finish: str | None, fingerprint: bool
) -> dict[str, Any]:
    """A ``text_completion`` stream chunk."""
    choice = {
        "index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
        "prompt_token_ids": None, "token_ids": None,
    }  # fmt: skip
    out: dict[str, Any] = {"id": req_id, "object": "text_completion", "created": created, "model": model}
    out["choices"] = [choice]
    if finish is not None and fingerprint:
        out["system_fingerprint"] = FINGERPRINT
    return out
