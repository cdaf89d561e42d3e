"""One canonical log line per request, with the numbers and without the prompt; config check probes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from tests.e2e.conftest import Stack
from tests.log_capture import capture_logs

SECRET_PROMPT = "the-password-is-swordfish"


def completed_lines(logs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == "request.completed"]


def wait_for_lines(logs: Sequence[Mapping[str, Any]], count: int) -> list[Mapping[str, Any]]:
    deadline = time.monotonic() + 30  # a stream's line is written after its last event, in the gateway's time
    while len(completed_lines(logs)) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return completed_lines(logs)


@pytest.mark.parametrize("stream", [False, True])
def test_request_completed_line(stack: Stack, stream: bool) -> None:
    body = {"model": "m-llama", "messages": [{"role": "user", "content": SECRET_PROMPT}], "max_tokens": 5}
    with capture_logs() as logs, stack.client() as client:
        if stream:
            with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
                response.read()
        else:
            response = client.post(
                "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-x"}
            )
        lines = wait_for_lines(logs, 1)
    assert len(lines) == 1
    line = lines[0]
    assert line["request_id"] == response.headers["x-request-id"]
    assert (line["model"], line["backend"], line["status"]) == ("m-llama", "llama", 200)
    assert line["reason"].startswith("only-candidate")
    assert line["completion_tokens"] == 5
    assert line["prompt_tokens"] > 0
    assert line["cached_tokens"] is not None
    if stream:  # a whole body's first token: tests/e2e/test_ttft_truth.py
        assert line["ttft_ms"] is not None
        assert line["duration_ms"] >= line["ttft_ms"]
    assert line["retries"] == 0
    assert SECRET_PROMPT not in repr(logs)
    assert "sk-x" not in repr(logs)


def test_error_is_logged_with_its_status(stack: Stack) -> None:
    with capture_logs() as logs, stack.client() as client:
        client.post(
            "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}
        )
        lines = wait_for_lines(logs, 1)
    assert lines[0]["status"] == 404
    assert "nope" in lines[0]["error"]


def test_config_check_probes_every_backend(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vllm, llama = stack.sims["vllm"].url, stack.sims["llama"].url
    config = tmp_path / "turnout.toml"
    config.write_text(
        f"""
[[backends]]
id = "vllm"
kind = "vllm"
url = "{vllm}"

[[backends]]
id = "llama"
kind = "llamacpp"
url = "{llama}"

[[backends]]
id = "gone"
kind = "openai"
url = "http://127.0.0.1:9"

[[models]]
name = "m"
  [[models.deployments]]
  backend = "vllm"
  upstream_name = "up-vllm"
  [[models.deployments]]
  backend = "llama"
  upstream_name = "wrong-name"
"""
    )
    assert main(["config", "check", str(config)]) == 3
    out = capsys.readouterr().out
    # as a user runs it: each probe said once, in the table, with no log line beside it (issue #60)
    ran = subprocess.run(
        [sys.executable, "-m", "gateway", "config", "check", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 3
    assert "backend.health" not in ran.stdout + ran.stderr
    assert "valid (3 backends, 1 models)" in out
    assert "vllm" in out
    assert "up-vllm (32768 tokens)" in out
    assert "NOT SERVED: wrong-name" in out
    assert "gone" in out
    assert "down" in out
    verdict = "2 of 3 backends not ready, not serving their models, or clearing their slots (exit status 3)"
    assert verdict in out


def test_config_check_rejects_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[[backends]]\nid = "x"\nkind = "nope"\nurl = "http://127.0.0.1:1"\n')
    assert main(["config", "check", str(config)]) == 1
    assert "backends.0.kind" in capsys.readouterr().err
    # a check across fields reads as the README's example: the fields, then what is wrong
    config.write_text(
        '[[backends]]\nid = "vllm"\nkind = "vllm"\nurl = "http://127.0.0.1:1"\n'
        '[[models]]\nname = "m"\n[[models.deployments]]\nbackend = "vlm"\nupstream_name = "x"\n'
    )
    assert main(["config", "check", str(config)]) == 1
    assert capsys.readouterr().err == (
        f"turnout: invalid configuration: {config}: models.m.deployments: unknown backend 'vlm' "
        "(configured: vllm)\n"
    )
