"""The vLLM simulator over HTTP: shapes, streams, block-aligned prefix cache, errors, batching, cancel."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

from backends.parsers import vllm
from backends.sim.engine_base import BatchEngine
from backends.sim.events import EventKind
from backends.sim.task import SimTask
from tests.backends.sim.simhelp import LONG_TEXT, WEATHER_TOOL, running, sse_data, sse_json, user, wait_until


def complete(client: httpx.Client, prompt: list[int], **extra: Any) -> dict[str, Any]:
    response = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, **extra})
    assert response.status_code == 200, response.text
    return dict(response.json())


HOLDABLE: dict[str, Any] = {"prefill_tok_s": 1280, "prefill_chunk": 64, "context_window": 65536}
"""Settings under which :func:`decode_together` can hold requests: a 64-token prefill step takes 50 ms."""
BLOCKER_PROMPT = [7] * 60_000
"""940 prefill steps, 47 s of them: the hold lasts until the test lets go, however busy the machine."""


def decode_together(client: httpx.Client, engine: BatchEngine, n: int) -> list[SimTask]:
    """Run ``n`` identical 40-token completions that start decoding in the same engine step; their tasks.

    Every step gives its prefill budget to the running requests in arrival order, and a request
    decodes only once its prompt is done. A blocker whose long prompt takes the whole budget of every
    step therefore holds the ``n`` requests (admitted, prompts untouched) until they have all joined
    the batch; then the blocker's stream is closed (its request is cancelled), and the ``n`` prompts
    are prefilled in one step and decode side by side to the end.
    """
    payload = {"prompt": "go", "max_tokens": 40, "ignore_eos": True}
    statuses: list[int] = []
    blocker_body = {"prompt": BLOCKER_PROMPT, "max_tokens": 1, "stream": True}
    with client.stream("POST", "/v1/completions", json=blocker_body) as blocker:
        assert blocker.status_code == 200
        assert wait_until(lambda: len(engine.running) == 1)
        (hold,) = engine.running
        threads = [
            threading.Thread(
                target=lambda: statuses.append(client.post("/v1/completions", json=payload).status_code)
            )
            for _ in range(n)
        ]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: len(engine.running) == n + 1)
        tasks = [t for t in engine.running if t is not hold]
        assert hold.prefill_left > 0, "the blocker's prompt ran out before the requests had joined"
        assert all(t.prefill_left > 0 and t.n_emitted == 0 for t in tasks)  # none has started yet
    for thread in threads:
        thread.join(60)
    assert statuses == [200] * n
    return tasks


class TestShapes:
    def test_info_endpoints(self) -> None:
        """/health (empty 200), /v1/models, /version, /load, /tokenize and /metrics names."""
        with running("vllm", context_window=8192, model="qwen") as (client, _):
            health = client.get("/health")
            assert health.status_code == 200
            assert health.content == b""
            card = client.get("/v1/models").json()["data"][0]
            assert (card["id"], card["owned_by"], card["max_model_len"], card["parent"]) == (
                "qwen",
                "vllm",
                8192,
                None,
            )
            assert card["permission"][0]["object"] == "model_permission"
            assert client.get("/version").json() == {"version": "0.32.0"}
            assert client.get("/load").json() == {"server_load": 0}
            tok = client.post("/tokenize", json={"prompt": "hello world"}).json()
            assert list(tok) == ["count", "max_model_len", "tokens", "token_strs"]
            assert tok["count"] == len(tok["tokens"])
            assert tok["token_strs"] is None
            text = client.get("/metrics").text
            labels = '{model_name="qwen",engine="0"}'
            for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
                assert f"# TYPE vllm:{name} gauge\nvllm:{name}{labels} " in text
            for name in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens"):
                assert f"# TYPE vllm:{name}_total counter\nvllm:{name}_total{labels} " in text
                assert f"vllm:{name}_created{labels} " in text

    def test_chat_non_stream(self) -> None:
        """chat.completion with usage.prompt_tokens_details.cached_tokens (flag on) and nulls kept."""
        with running("vllm") as (client, _):
            body = client.post(
                "/v1/chat/completions", json={"model": "sim-model", "messages": [user("hi")]}
            ).json()
            assert body["object"] == "chat.completion"
            assert body["id"].startswith("chatcmpl-")
            choice = body["choices"][0]
            assert choice["finish_reason"] == "stop"
            assert choice["stop_reason"] is None
            assert choice["message"]["role"] == "assistant"
            assert "tool_calls" not in choice["message"]
            usage = body["usage"]
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        with running("vllm", enable_prompt_tokens_details=False) as (client, _):
            body = client.post("/v1/chat/completions", json={"messages": [user("hi")]}).json()
            assert body["usage"]["prompt_tokens_details"] is None

    def test_chat_stream_sequence(self) -> None:
        """Role chunk (content ""), content chunks, finish chunk, usage chunk (choices []), [DONE]."""
        with running("vllm") as (client, _):
            payload = {
                "messages": [user("hi")],
                "stream": True,
                "max_tokens": 4,
                "stream_options": {"include_usage": True},
            }
            data = sse_data(client.post("/v1/chat/completions", json=payload).text)
            assert data[-1] == "[DONE]"
            chunks = [json.loads(d) for d in data[:-1]]
            assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert [c["choices"][0]["finish_reason"] for c in chunks[1:-1]] == [None, None, None, "length"]
            assert chunks[-1]["choices"] == []
            usage = chunks[-1]["usage"]
            n_prompt = usage["prompt_tokens"]
            assert usage == {
                "prompt_tokens": n_prompt,
                "total_tokens": n_prompt + 4,
                "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": 0},  # < one block
            }

    def test_stream_stop_without_usage(self) -> None:
        """A natural stop ends with delta {"content": ""} and the fingerprint; no usage chunk."""
        with running("vllm") as (client, _):
            chunks = sse_json(
                client.post("/v1/chat/completions", json={"messages": [user("hi")], "stream": True}).text
            )
            assert chunks[-1]["choices"][0]["delta"] == {"content": ""}
            assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
            assert "system_fingerprint" in chunks[-1]
            assert all("usage" not in c for c in chunks)

    def test_completions_stream(self) -> None:
        """text_completion chunks then the usage chunk and [DONE]."""
        with running("vllm") as (client, _):
            payload = {
                "prompt": "Once",
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            chunks = sse_json(client.post("/v1/completions", json=payload).text)
            assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "length"]
            assert chunks[-1]["usage"]["completion_tokens"] == 3


class TestPrefixCache:
    def test_hybrid_block_aligned_hits(self) -> None:
        """600 tokens then an extension: 512 cached with 256-token blocks; none with prefix caching off."""
        first, extended = list(range(1000, 1600)), list(range(1000, 1700))
        with running("vllm", block_size=256) as (client, _):
            assert complete(client, first)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert complete(client, extended)["usage"]["prompt_tokens_details"]["cached_tokens"] == 512
            metrics = client.get("/metrics").text
            assert 'vllm:prefix_cache_hits_total{model_name="sim-model",engine="0"} 512.0' in metrics
            assert 'vllm:prefix_cache_queries_total{model_name="sim-model",engine="0"} 1300.0' in metrics
        with running("vllm", block_size=256, prefix_caching=False) as (client, _):
            complete(client, first)
            assert complete(client, extended)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    def test_dense_uses_small_blocks(self) -> None:
        """Dense models hash 16-token blocks."""
        with running("vllm", architecture="dense") as (client, _):
            complete(client, list(range(1000, 1600)))
            assert (
                complete(client, list(range(1000, 1700)))["usage"]["prompt_tokens_details"]["cached_tokens"]
                == 592
            )

    def test_the_cache_drops_its_least_recently_used_blocks_and_says_how_much_it_holds(self) -> None:
        """The KV pool (3x the window: 3,000 tokens here) bounds the prefix cache, as
        ``vllm:cache_config_info`` reports it (``kv_cache_size_tokens``, ``num_gpu_blocks``): a prefix
        is there until more than that was cached after it (turnout's ``cache_tokens``)."""
        first = list(range(1000, 1600))
        with running("vllm", architecture="dense", context_window=1000) as (client, _):
            assert vllm.parse_metrics(client.get("/metrics").text).cache_tokens == 3000
            complete(client, first)
            for n in range(3):  # 1,800 tokens more: it is still there
                complete(client, list(range(20_000 + 1000 * n, 20_600 + 1000 * n)))
            assert complete(client, first)["usage"]["prompt_tokens_details"]["cached_tokens"] == 592
            for n in range(6):  # 3,600 tokens more: dropped
                complete(client, list(range(40_000 + 1000 * n, 40_600 + 1000 * n)))
            assert complete(client, first)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


class TestErrors:
    def test_context_overflow_and_clamp(self) -> None:
        """Prompt > max_model_len: 400 BadRequestError; prompt + max_tokens overflow is clamped."""
        with running("vllm", context_window=64) as (client, engine):
            response = client.post("/v1/completions", json={"prompt": list(range(1000, 1100))})
            assert response.status_code == 400
            message = (
                "This model's maximum context length is 64 tokens. However, your prompt contains 100 "
                "input tokens, which exceeds this limit even without any output tokens. Please reduce the "
                "length of the input prompt. (parameter=input_tokens, value=100)"
            )
            error = {"message": message, "type": "BadRequestError", "param": "input_tokens", "code": 400}
            assert response.json() == {"error": error}
            clamped = complete(client, list(range(1000, 1060)), max_tokens=50)
            assert clamped["usage"]["completion_tokens"] == 4
            assert clamped["choices"][0]["finish_reason"] == "length"
            assert engine.events[0].kind is EventKind.REJECT

    def test_validation_errors(self) -> None:
        """stream_options without stream, missing messages, bad JSON: 400 Bad Request; unknown model: 404."""
        with running("vllm") as (client, _):
            opts = client.post(
                "/v1/chat/completions",
                json={"messages": [user("x")], "stream_options": {"include_usage": True}},
            )
            assert opts.status_code == 400
            assert opts.json()["error"]["type"] == "BadRequestError"
            assert opts.json()["error"]["param"] == "stream_options"
            assert "Stream options can only be defined when `stream=True`." in opts.json()["error"]["message"]
            missing = client.post("/v1/chat/completions", json={"model": "sim-model"})
            assert missing.status_code == 400
            assert missing.json()["error"]["param"] == "body.messages"
            bad = client.post(
                "/v1/chat/completions", content=b"{", headers={"content-type": "application/json"}
            )
            assert bad.status_code == 400
            unknown = client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": [user("x")]})
            assert unknown.status_code == 404
            error = unknown.json()["error"]
            assert error["type"] == "NotFoundError"
            assert error["message"].startswith("The model `gpt-9` does not exist.")
            assert client.get("/nowhere").json() == {"detail": "Not Found"}

    def test_auth(self) -> None:
        """--api-key guards /v1 paths only, with the non-standard body."""
        with running("vllm", api_key="k") as (client, _):
            denied = client.get("/v1/models")
            assert (denied.status_code, denied.json()) == (401, {"error": "Unauthorized"})
            assert client.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200
            assert client.get("/health").status_code == 200
            assert client.get("/metrics").status_code == 200


class TestEngine:
    def test_decode_slows_with_batch(self) -> None:
        """8 concurrent streams decode slower per token than one alone (ratio, not absolute time).

        Per-token time is read in simulated seconds off each request's task (the engine's clock, not
        the wall clock a busy machine stretches), and the requests decode side by side from their
        first token (:func:`decode_together`), so the batch is 8 wide however slowly the threads start.
        """
        with running("vllm", time_scale=1.0, decode_tok_s=1000, batch_slowdown=0.5, **HOLDABLE) as (
            client,
            engine,
        ):

            def per_token(n: int) -> list[float]:
                tasks = decode_together(client, engine, n)
                assert {t.n_emitted for t in tasks} == {40}
                return [(t.sim_last - t.sim_prompt_end) / (t.n_emitted - 1) for t in tasks]

            (solo,) = per_token(1)
            assert min(per_token(8)) > 2 * solo

    def test_streaming_headers_before_queue_and_cancel(self) -> None:
        """Headers arrive while queued (max_num_seqs=1); closing the stream cancels the queued request."""
        with running("vllm", time_scale=1.0, decode_tok_s=100, max_num_seqs=1) as (client, engine):
            # 3000 tokens at 100 tok/s: the first request runs 30 s unless cancelled, which the test does
            # as soon as it has looked, so the queued request and /metrics always see it running
            payload = {
                "messages": [user(LONG_TEXT)],
                "max_tokens": 3000,
                "ignore_eos": True,
                "stream": True,
            }
            with client.stream("POST", "/v1/chat/completions", json=payload) as first:
                lines = first.iter_lines()
                next(lines)
                with client.stream("POST", "/v1/chat/completions", json=payload) as queued:
                    assert queued.status_code == 200
                    assert (
                        'vllm:num_requests_waiting{model_name="sim-model",engine="0"} 1.0'
                        in client.get("/metrics").text
                    )
            assert wait_until(lambda: len([e for e in engine.events if e.kind is EventKind.CANCEL]) == 2)
            assert not [e for e in engine.events if e.kind is EventKind.FINISH]
            assert wait_until(lambda: not engine.running and not engine.waiting)

    def test_tool_call_stream(self) -> None:
        """A tool call streams id/type/name first, then argument fragments; finish_reason tool_calls."""
        with running("vllm") as (client, _):
            payload = {"messages": [user("weather?")], "tools": [WEATHER_TOOL], "stream": True}
            chunks = sse_json(client.post("/v1/chat/completions", json=payload).text)
            calls = [
                c["choices"][0]["delta"]["tool_calls"][0]
                for c in chunks
                if "tool_calls" in c["choices"][0]["delta"]
            ]
            assert calls[0]["id"].startswith("chatcmpl-tool-")
            assert calls[0]["function"] == {"name": "get_weather"}
            assert json.loads("".join(c["function"]["arguments"] for c in calls[1:]))["city"]
            assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
            body = client.post("/v1/chat/completions", json={**payload, "stream": False}).json()
            message = body["choices"][0]["message"]
            assert message["content"] is None
            assert message["tool_calls"][0]["function"]["name"] == "get_weather"

    def test_without_tool_calls_the_model_answers_in_text_unless_a_tool_is_named(self) -> None:
        with running("vllm", tool_calls=False) as (client, _):
            payload = {"messages": [user("weather?")], "tools": [WEATHER_TOOL]}
            message = client.post("/v1/chat/completions", json=payload).json()["choices"][0]["message"]
            assert message["content"]
            assert not message.get("tool_calls")
            named = {**payload, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
            forced = client.post("/v1/chat/completions", json=named).json()["choices"][0]["message"]
            assert forced["tool_calls"][0]["function"]["name"] == "get_weather"
