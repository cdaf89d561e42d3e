"""The llama-server simulator over HTTP: shapes, streams, slots, reuse, errors, cancellation."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from backends.sim.events import EventKind
from backends.sim.llama_engine import LlamaEngine
from tests.backends.sim.simhelp import LONG_TEXT, WEATHER_TOOL, running, sse_data, sse_json, user, wait_until

LONG_ANSWER = {"max_tokens": 3000, "ignore_eos": True}
"""30 s of answer at 100 tok/s: a request the test ends by closing its stream holds its slot until then."""
TIMING_KEYS = [
    "cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
    "predicted_ms", "predicted_per_token_ms", "predicted_per_second",
]  # fmt: skip


def chat(client: httpx.Client, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    response = client.post("/v1/chat/completions", json={"messages": messages, **extra})
    assert response.status_code == 200, response.text
    return dict(response.json())


class TestShapes:
    def test_info_endpoints(self) -> None:
        """/health, /props, /slots, /v1/models, /metrics, /tokenize answer with the real keys."""
        with running("llamacpp", slots=3, context_window=4096, model="qwen") as (client, _):
            assert client.get("/health").json() == {"status": "ok"}
            props = client.get("/props").json()
            assert props["total_slots"] == 3
            assert props["default_generation_settings"]["n_ctx"] == 4096
            assert props["model_alias"] == "qwen"
            slots = client.get("/slots").json()
            assert [s["id"] for s in slots] == [0, 1, 2]
            assert set(slots[0]) == {"id", "n_ctx", "speculative", "is_processing"}
            models = client.get("/v1/models").json()
            assert models["data"][0]["meta"]["n_ctx"] == 4096
            assert models["data"][0]["owned_by"] == "llamacpp"
            assert models["models"][0]["name"] == "qwen"
            metrics = client.get("/metrics")
            assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
            for name in ("requests_processing", "requests_deferred", "prompt_tokens_total",
                         "prompt_tokens_cached_total", "tokens_predicted_total"):  # fmt: skip
                assert f"# TYPE llamacpp:{name} " in metrics.text
                assert f"\nllamacpp:{name} " in metrics.text
            tokens = client.post("/tokenize", json={"content": "hello world"}).json()["tokens"]
            assert tokens
            assert all(isinstance(t, int) for t in tokens)

    def test_chat_non_stream(self) -> None:
        """chat.completion with usage (full prompt) and timings (prompt_n + cache_n == prompt_tokens)."""
        with running("llamacpp") as (client, _):
            body = chat(client, [user("hi")])
            assert list(body) == [
                "choices",
                "created",
                "model",
                "system_fingerprint",
                "object",
                "usage",
                "id",
                "timings",
            ]
            assert body["object"] == "chat.completion"
            assert body["choices"][0]["finish_reason"] == "stop"
            assert body["choices"][0]["message"]["role"] == "assistant"
            assert list(body["timings"]) == TIMING_KEYS
            usage, timings = body["usage"], body["timings"]
            assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == timings["cache_n"]
            assert usage["completion_tokens"] == timings["predicted_n"]
            assert 16 < usage["completion_tokens"] <= 49

    def test_chat_stream_sequence(self) -> None:
        """Role chunk (content null), content chunks, finish chunk, usage chunk with timings, [DONE]."""
        with running("llamacpp") as (client, _):
            payload = {
                "messages": [user("hi")],
                "stream": True,
                "max_tokens": 5,
                "stream_options": {"include_usage": True},
            }
            response = client.post("/v1/chat/completions", json=payload)
            data = sse_data(response.text)
            assert data[-1] == "[DONE]"
            chunks = [json.loads(d) for d in data[:-1]]
            assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
            contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
            assert len(contents) == 5
            assert all(isinstance(c, str) for c in contents)
            assert chunks[-2]["choices"][0] == {"finish_reason": "length", "index": 0, "delta": {}}
            assert chunks[-1]["choices"] == []
            assert chunks[-1]["usage"]["completion_tokens"] == 5
            assert "timings" in chunks[-1]
            assert all("timings" not in c for c in chunks[:-1])

    def test_stream_without_usage_puts_timings_on_finish_chunk(self) -> None:
        """Without include_usage the finish chunk is last and carries timings."""
        with running("llamacpp") as (client, _):
            response = client.post("/v1/chat/completions", json={"messages": [user("hi")], "stream": True})
            chunks = sse_json(response.text)
            assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
            assert "timings" in chunks[-1]
            assert "usage" not in chunks[-1]

    def test_completions(self) -> None:
        """/v1/completions: text_completion, streamed chunks, final chunk with usage and timings."""
        with running("llamacpp") as (client, _):
            body = client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 4}).json()
            assert body["object"] == "text_completion"
            assert body["choices"][0]["finish_reason"] == "length"
            stream = client.post(
                "/v1/completions", json={"prompt": "Once upon", "max_tokens": 4, "stream": True}
            )
            chunks = sse_json(stream.text)
            assert "".join(c["choices"][0]["text"] for c in chunks) == body["choices"][0]["text"]
            assert chunks[-1]["usage"]["completion_tokens"] == 4
            assert "timings" in chunks[-1]
            assert sse_data(stream.text)[-1] == "[DONE]"


class TestSlots:
    def test_pinned_multi_turn_reuse_grows(self) -> None:
        """Replaying answers on a pinned hybrid slot reuses the whole previous prompt + answer."""
        with running("llamacpp", slots=2) as (client, _):
            messages: list[dict[str, Any]] = [user(LONG_TEXT)]
            previous: dict[str, Any] | None = None
            cached: list[int] = []
            for turn in range(3):
                body = chat(client, messages, id_slot=0)
                timings, usage = body["timings"], body["usage"]
                assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
                if previous is not None:
                    expected = previous["usage"]["prompt_tokens"] + previous["usage"]["completion_tokens"] - 1
                    assert timings["cache_n"] == expected
                cached.append(timings["cache_n"])
                messages += [body["choices"][0]["message"], user(f"turn {turn}: go on")]
                previous = body
            assert cached[0] == 0 < cached[1] < cached[2]

    def test_hybrid_divergence_falls_back_to_checkpoint(self) -> None:
        """A rewritten answer diverges; hybrid restores the N-4 checkpoint, dense reuses the LCP."""
        for architecture, expected_offset in (("hybrid", 4), ("dense", 0)):
            with running("llamacpp", slots=1, architecture=architecture) as (client, _):
                first = chat(client, [user(LONG_TEXT)])
                n = first["usage"]["prompt_tokens"]
                edited = [user(LONG_TEXT), {"role": "assistant", "content": "Something else."}, user("and?")]
                second = chat(client, edited)
                assert second["timings"]["cache_n"] == n - expected_offset, architecture

    def test_lru_then_similarity(self) -> None:
        """Fresh server: highest slot first, LRU next, then the slot sharing the prompt prefix."""
        with running("llamacpp", slots=2) as (client, engine):
            chat(client, [user(LONG_TEXT)])
            chat(client, [user("Something unrelated " * 30)])
            chat(client, [user(LONG_TEXT), {"role": "assistant", "content": "ok"}, user("more")])
            starts = [e.slot for e in engine.events if e.kind is EventKind.START]
            assert starts == [1, 0, 1]

    def test_pinned_request_waits_for_busy_slot(self) -> None:
        """A request pinned to a busy slot is deferred although another slot is idle, and it starts on
        that slot once the request holding it has left (here: closed its stream, so the first request
        holds the slot for exactly as long as the test needs and never makes it wait for its answer)."""
        with running("llamacpp", slots=2, time_scale=1.0, decode_tok_s=100) as (client, engine):
            payload = {**LONG_ANSWER, "messages": [user("long one")], "id_slot": 0, "stream": True}
            with client.stream("POST", "/v1/chat/completions", json=payload) as first:
                lines = first.iter_lines()
                next(lines)
                result: dict[str, Any] = {}
                waiter = threading.Thread(target=lambda: result.update(chat(client, [user("x")], id_slot=0)))
                waiter.start()
                assert wait_until(lambda: "llamacpp:requests_deferred 1" in client.get("/metrics").text)
                assert not result
            waiter.join(60)
            assert not waiter.is_alive()
            starts = [e for e in engine.events if e.kind is EventKind.START]
            end_first = next(e for e in engine.events if e.kind in (EventKind.FINISH, EventKind.CANCEL))
            assert (end_first.kind, end_first.request_id) == (EventKind.CANCEL, starts[0].request_id)
            assert [e.slot for e in starts] == [0, 0]
            assert starts[1].at >= end_first.at
            assert result["choices"][0]["finish_reason"] == "stop"


class TestErrors:
    def test_context_overflow(self) -> None:
        """A prompt longer than the slot context fails with exceed_context_size_error, streaming too."""
        with running("llamacpp", context_window=32) as (client, engine):
            for stream in (False, True):
                response = client.post(
                    "/v1/chat/completions", json={"messages": [user(LONG_TEXT)], "stream": stream}
                )
                assert response.status_code == 400
                error = response.json()["error"]
                n = error["n_prompt_tokens"]
                assert error == {
                    "code": 400,
                    "message": f"request ({n} tokens) exceeds the available context size (32 tokens), "
                    "try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": n,
                    "n_ctx": 32,
                }
            assert [e.kind for e in engine.events] == [EventKind.REJECT, EventKind.REJECT]
            assert client.get("/slots").json()[1]["is_processing"] is False

    def test_auth(self) -> None:
        """Wrong or missing key: 401 authentication_error; /health is exempt; X-Api-Key also works."""
        with running("llamacpp", api_key="k") as (client, _):
            denied = client.get("/v1/models")
            assert denied.status_code == 401
            assert denied.json() == {
                "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
            }
            assert client.get("/health").status_code == 200
            assert client.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200
            assert client.get("/props", headers={"X-Api-Key": "k"}).status_code == 200

    def test_loading_then_ready(self) -> None:
        """Every path answers 503 Loading model until load_seconds pass, then the server is ready.

        The load time counts from the engine's construction, before the server thread starts, so it
        is 10 s: starting the server and the three requests fit in it even on a busy machine.
        """
        with running("llamacpp", load_seconds=10.0, time_scale=1.0) as (client, engine):
            for path in ("/health", "/v1/models", "/nowhere"):
                response = client.get(path)
                assert response.status_code == 503
                assert response.json() == {
                    "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
                }
            assert wait_until(lambda: client.get("/health").status_code == 200)
            assert isinstance(engine, LlamaEngine)
            assert time.monotonic() - engine.started_at >= 10.0
            assert client.get("/v1/models").status_code == 200

    def test_not_found_and_bad_json(self) -> None:
        """Unknown path: 404 File Not Found; malformed JSON: 400 invalid_request_error."""
        with running("llamacpp") as (client, _):
            missing = client.get("/nowhere")
            assert missing.status_code == 404
            assert missing.json() == {
                "error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}
            }
            bad = client.post(
                "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
            )
            assert bad.status_code == 400
            assert bad.json()["error"]["type"] == "invalid_request_error"


class TestCancellation:
    def test_disconnect_mid_stream_frees_slot(self) -> None:
        """Closing a stream records a cancel event and the slot becomes idle."""
        with running("llamacpp", slots=1, time_scale=1.0, decode_tok_s=100) as (client, engine):
            payload = {**LONG_ANSWER, "messages": [user("go")], "stream": True}
            with client.stream("POST", "/v1/chat/completions", json=payload) as response:
                lines = response.iter_lines()
                next(lines)
            assert wait_until(lambda: any(e.kind is EventKind.CANCEL for e in engine.events))
            assert not [e for e in engine.events if e.kind is EventKind.FINISH]
            assert client.get("/slots").json()[0]["is_processing"] is False

    def test_disconnect_while_queued(self) -> None:
        """A queued request whose client leaves never starts; its stream had no headers."""
        with running("llamacpp", slots=1, time_scale=1.0, decode_tok_s=100) as (client, engine):
            payload = {**LONG_ANSWER, "messages": [user("go")], "stream": True}
            with client.stream("POST", "/v1/chat/completions", json=payload) as response:
                lines = response.iter_lines()
                next(lines)
                try:
                    client.post(
                        "/v1/chat/completions",
                        json={**payload, "messages": [user("b")]},
                        timeout=httpx.Timeout(30, read=0.2),
                    )
                    raise AssertionError("a queued stream must not get headers")
                except httpx.ReadTimeout:
                    pass
                assert wait_until(lambda: len([e for e in engine.events if e.kind is EventKind.CANCEL]) == 1)
            assert len([e for e in engine.events if e.kind is EventKind.START]) == 1


class TestToolCalls:
    def test_tool_call_stream_then_text_after_tool_result(self) -> None:
        """A user turn with tools streams a tool call; after the tool message the answer is text."""
        with running("llamacpp") as (client, _):
            payload = {"messages": [user("weather in Oslo?")], "tools": [WEATHER_TOOL], "stream": True}
            chunks = sse_json(client.post("/v1/chat/completions", json=payload).text)
            calls = [
                c["choices"][0]["delta"]["tool_calls"][0]
                for c in chunks
                if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
            ]
            assert calls[0]["function"] == {"name": "get_weather"}
            assert calls[0]["type"] == "function"
            assert calls[0]["id"]
            arguments = json.loads("".join(c["function"].get("arguments", "") for c in calls))
            assert set(arguments) == {"city", "days"}
            assert len(calls) > 2
            assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
            call = {
                "id": calls[0]["id"],
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(arguments)},
            }
            follow = [user("weather in Oslo?"), {"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"}]  # fmt: skip
            body = chat(client, follow, tools=[WEATHER_TOOL])
            assert body["choices"][0]["finish_reason"] == "stop"
            assert body["choices"][0]["message"]["content"]
