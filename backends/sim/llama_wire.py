"""llama-server JSON bodies, key for key and in the same order (``tools/server/server-task.cpp``).

Pure functions from a finished or running :class:`SimTask` to dicts; the app encodes them.
"""

from __future__ import annotations

import time
from typing import Any

from backends.sim.generation import DeltaKind, OutToken
from backends.sim.task import SimTask

BUILD_INFO = "b11434-sim"
SSE_DONE = b"data: [DONE]\n\n"


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """``format_error_response`` wrapped in ``{"error": ...}``."""
    return {"error": {"code": code, "message": message, "type": kind}}


def timings(task: SimTask) -> dict[str, float | int]:
    """``server_slot_stats::to_json``: prompt and generation counts and simulated times.

    ``prompt_n + cache_n == prompt_tokens``; ``predicted_per_*`` use ``predicted_n - 1`` decode steps
    (the first token comes with the last prompt batch).
    """
    prompt_ms = (task.sim_prompt_end - task.sim_start) * 1000.0 if task.sim_prompt_end else 0.0
    prompt_n = len(task.prompt) - task.cached
    n_gen = task.n_emitted
    steps = max(n_gen - 1, 0)
    gen_ms = max(task.sim_last - task.sim_prompt_end, 1e-6) * 1000.0 if n_gen else 0.0
    return {
        "cache_n": task.cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 / prompt_ms * prompt_n if prompt_ms > 0 else 0.0,
        "predicted_n": n_gen,
        "predicted_ms": gen_ms,
        "predicted_per_token_ms": gen_ms / steps if steps else 0.0,
        "predicted_per_second": 1e3 / gen_ms * steps if gen_ms > 0 else 0.0,
    }


def usage(task: SimTask) -> dict[str, Any]:
    """``usage_json_oaicompat``: ``prompt_tokens`` is the full prompt, cached tokens included."""
    return {
        "completion_tokens": task.n_emitted,
        "prompt_tokens": len(task.prompt),
        "total_tokens": task.n_emitted + len(task.prompt),
        "prompt_tokens_details": {"cached_tokens": task.cached},
    }


def _tool_call_json(task: SimTask) -> list[dict[str, Any]]:
    call = task.answer.tool_call
    if call is None:
        return []
    return [
        {
            "type": "function",
            "function": {"name": call.name, "arguments": task.answer.arguments},
            "id": call.key,
        }
    ]


def chat_message(task: SimTask) -> dict[str, Any]:
    """``common_chat_msg::to_json_oaicompat`` for the answer."""
    message: dict[str, Any] = {"role": "assistant", "content": task.answer.text}
    if task.answer.reasoning:
        message["reasoning_content"] = task.answer.reasoning
    calls = _tool_call_json(task)
    if calls:
        message["tool_calls"] = calls
    return message


def chat_response(task: SimTask, cmpl_id: str, model: str) -> dict[str, Any]:
    """Non-streamed ``chat.completion`` with ``usage`` and ``timings``."""
    choice = {"finish_reason": task.answer.finish_reason, "index": 0, "message": chat_message(task)}
    return {
        "choices": [choice],
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": BUILD_INFO,
        "object": "chat.completion",
        "usage": usage(task),
        "id": cmpl_id,
        "timings": timings(task),
    }


def chunk(delta: dict[str, Any], finish_reason: str | None, cmpl_id: str, model: str) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with a single choice."""
    return {
        "choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}],
        "created": int(time.time()),
        "id": cmpl_id,
        "model": model,
        "system_fingerprint": BUILD_INFO,
        "object": "chat.completion.chunk",
    }


def token_delta(task: SimTask, token: OutToken) -> dict[str, Any] | None:
    """``server_chat_msg_diff_to_json_oaicompat`` of one generated token (None: no diff)."""
    call = task.answer.tool_call
    if token.kind is DeltaKind.TEXT:
        return {"content": token.text}
    if token.kind is DeltaKind.REASONING:
        return {"reasoning_content": token.text}
    if token.kind is DeltaKind.TOOL_START and call is not None:
        return {
            "tool_calls": [{"index": 0, "id": call.key, "type": "function", "function": {"name": call.name}}]
        }
    if token.kind is DeltaKind.TOOL_ARGS:
        return {"tool_calls": [{"index": 0, "function": {"arguments": token.text}}]}
    return None


def chat_final_chunks(task: SimTask, cmpl_id: str, model: str, include_usage: bool) -> list[dict[str, Any]]:
    """``to_json_oaicompat_chat_stream``: finish chunk, usage chunk if asked, ``timings`` on the last."""
    chunks = [chunk({}, task.answer.finish_reason, cmpl_id, model)]
    if include_usage:
        last = chunk({}, None, cmpl_id, model)
        last["choices"] = []
        last["usage"] = usage(task)
        chunks.append(last)
    chunks[-1]["timings"] = timings(task)
    return chunks


def completion_response(task: SimTask, cmpl_id: str, model: str, *, stream: bool) -> dict[str, Any]:
    """``text_completion`` (non-stream, or the final stream chunk whose text is empty)."""
    choice = {
        "text": "" if stream else task.answer.raw_text,
        "index": 0,
        "logprobs": None,
        "finish_reason": task.answer.finish_reason,
    }
    return {
        "choices": [choice],
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": BUILD_INFO,
        "object": "text_completion",
        "usage": usage(task),
        "id": cmpl_id,
        "timings": timings(task),
    }


def completion_chunk(text: str, cmpl_id: str, model: str) -> dict[str, Any]:
    """A partial ``text_completion`` stream chunk."""
    return {
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}],
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": BUILD_INFO,
        "object": "text_completion",
        "id": cmpl_id,
    }
