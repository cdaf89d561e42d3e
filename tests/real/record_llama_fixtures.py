"""Record a real llama-server's answers as parser fixtures.

    .venv/bin/python -m tests.real.record_llama_fixtures

Starts the built llama-server on the tiny qwen35 model (2 slots of 2048 tokens), keeps one slot
busy with a long generation, and writes what the probes read (``/props``, ``/slots``,
``/metrics``, ``/v1/models``) plus a short streamed and a non-streamed chat completion into
``tests/backends/fixtures/llama_*``. The parser tests read those files.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.real.build_llama_server import cache_root, ensure_llama_server
from tests.real.gguf_qwen35 import GENERATOR_VERSION, write_qwen35_gguf
from tests.real.llama_server import LlamaServer

FIXTURES = Path(__file__).resolve().parents[1] / "backends" / "fixtures"
ALIAS = "tiny-qwen35"


def _model() -> Path:
    path = cache_root() / "models" / f"tiny-qwen35-v{GENERATOR_VERSION}-seed0-l4-ctx4096.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_qwen35_gguf(path, seed=0, n_layer=4, context_length=4096)
    return path


def record(out: Path = FIXTURES) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        LlamaServer(
            ensure_llama_server(),
            _model(),
            log_path=Path(tmp) / "llama.log",
            alias=ALIAS,
            n_parallel=2,
            ctx_total=4096,
        ) as server,
        httpx.Client(base_url=server.base_url, timeout=120) as client,
    ):
        chat = {"model": ALIAS, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}
        (out / "llama_chat.json").write_bytes(client.post("/v1/chat/completions", json=chat).content)
        stream = client.post("/v1/chat/completions", json={**chat, "stream": True})
        (out / "llama_chat_stream.txt").write_bytes(stream.content)
        long = {**chat, "max_tokens": 1500, "ignore_eos": True, "id_slot": 1}
        busy = threading.Thread(
            target=lambda: httpx.post(server.base_url + "/v1/chat/completions", json=long, timeout=120)
        )
        busy.start()
        deadline = time.monotonic() + 30
        while (
            not any(s["is_processing"] for s in client.get("/slots").json()) and time.monotonic() < deadline
        ):
            time.sleep(0.01)
        for path, name in (
            ("/slots", "llama_slots.json"),
            ("/props", "llama_props.json"),
            ("/v1/models", "llama_models.json"),
        ):
            (out / name).write_text(json.dumps(client.get(path).json(), indent=1) + "\n")
        (out / "llama_metrics.txt").write_text(client.get("/metrics").text)
        busy.join()
    print(f"recorded llama-server fixtures into {out}")


if __name__ == "__main__":
    record()
