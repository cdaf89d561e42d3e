"""Live traffic recorded as a trace (``[record]``, gateway.traffic; issue #29): one line per answered
request with the engine's counts and the prompt's blocks as ids, no text; ``turnout replay`` reads it."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.replay.traces import read_trace
from gateway.traffic import TrafficRecorder
from policies import Endpoint, RequestFeatures
from policies.decision import Outcome
from policies.prefix import chain_of
from policies.sessions import session_label
from policies.types import EngineKind, Usage
from tests.e2e.conftest import start_stack, stop_stack
from tests.servers import ADMIN

SECRET = "zanzibar"  # a word of every prompt: it must not reach the file


def test_answered_requests_become_a_trace_that_replays(tmp_path: Path) -> None:
    path = tmp_path / "traffic.jsonl"
    running = start_stack(record={"path": str(path)})
    usage: dict[str, list[int]] = {}
    try:
        with httpx.Client(base_url=running.url, timeout=60) as client:
            for session in ("agent-a", "agent-b"):
                messages = [{"role": "system", "content": f"{SECRET} rules. " * 600}]
                for turn in range(3):
                    messages.append({"role": "user", "content": f"step {turn} {SECRET} " * 300})
                    body = {"model": "m-both", "messages": messages, "max_tokens": 5}
                    headers = {"x-session-id": session}
                    if session == "agent-b":  # an agent's calls: recorded as such ("agent": true)
                        headers["x-turnout-wait-for"] = "last-token"
                    answer = client.post("/v1/chat/completions", json=body, headers=headers)
                    assert answer.status_code == 200, answer.text
                    usage.setdefault(session, []).append(answer.json()["usage"]["prompt_tokens"])
                    messages.append(
                        {"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]}
                    )
            one_off = {"model": "m-both", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            assert client.post("/v1/chat/completions", json=one_off).status_code == 200
    finally:
        stop_stack(running)
    text = path.read_text()
    assert SECRET not in text
    assert "agent-a" not in text  # sessions by their hash, never the client's name
    trace = read_trace(path)
    assert len(trace) == 7
    by_session: dict[str | None, list[list[int]]] = {}
    for request in trace:
        by_session.setdefault(request.session, []).append(list(request.hash_ids))
    for name in ("agent-a", "agent-b"):
        turns = [r for r in trace if r.session == session_label(f"h:{name}")]
        assert [r.input_tokens for r in turns] == usage[name]  # the engine's own counts
        assert [r.agent for r in turns] == [name == "agent-b"] * 3
        ids = [list(r.hash_ids) for r in turns]
        for earlier, later in itertools.pairwise(ids):
            assert later[: len(earlier) - 1] == earlier[:-1]  # a turn repeats the last one's whole blocks
            assert len(later) >= len(earlier)
    a, b = (by_session[session_label(f"h:{n}")][0] for n in ("agent-a", "agent-b"))
    assert a[0] == b[0]  # the same system prompt opens both: its first block has one id
    assert [r.t for r in trace] == sorted(r.t for r in trace)
    assert trace[0].t == 0.0
    report = tmp_path / "report.json"
    replayed = subprocess.run(  # its own process: the CLI configures logging for the whole process
        [sys.executable, "-m", "gateway", "replay", str(path), "--no-oracle", "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(report.read_text())["profiles"]["cost"]["requests"] == 7


def features(text: str) -> RequestFeatures:
    chain = chain_of(text.encode())
    return RequestFeatures("m", Endpoint.CHAT, len(text) // 4, 8, False, chain=chain)


def outcome(tokens: int) -> Outcome:
    return Outcome("b", "m", EngineKind.VLLM, Usage(tokens, 8), 0.1, 0.5, 0, 0, False)


@pytest.mark.parametrize("keep", [0, 2])
def test_the_file_rotates_by_size_keeping_keep_old_ones(tmp_path: Path, keep: int) -> None:
    path = tmp_path / "t.jsonl"
    recorder = TrafficRecorder(path, max_bytes=300, keep=keep)
    for index in range(20):
        recorder.record(features("x" * 4000 + str(index)), outcome(1000), None, at=100.0 + index)
    recorder.close()
    files = {p.name for p in tmp_path.iterdir()}
    allowed = {"t.jsonl", *(f"t.jsonl.{i}" for i in range(1, keep + 1))}
    assert files <= allowed  # never more than ``keep`` old files
    assert f"t.jsonl.{keep}" in files or keep == 0  # it did rotate, that far
    for file in tmp_path.iterdir():
        assert file.stat().st_size < 300 + 200  # one line past the limit at most
        read_trace(file)  # each file is a trace on its own


def test_each_recording_begins_a_new_file(tmp_path: Path) -> None:
    """A restarted gateway (or an admin's new start) does not append to the last recording: its ``t``
    would start again at 0 and its block ids would name other blocks. The old file rotates away."""
    path = tmp_path / "t.jsonl"
    first = TrafficRecorder(path, keep=2)
    first.record(features("a" * 4000), outcome(1000), "s", at=500.0)
    first.record(features("a" * 5000), outcome(1250), "s", at=560.0)
    first.close()
    second = TrafficRecorder(path, keep=2)
    second.record(features("b" * 4000), outcome(1000), "s", at=900.0)
    second.close()
    assert [r.t for r in read_trace(path.with_name("t.jsonl.1"))] == [0.0, 60.0]
    (again,) = read_trace(path)
    assert (again.t, again.hash_ids[0]) == (0.0, 0)


def test_an_admin_switches_the_recording(tmp_path: Path) -> None:
    """``on_start = false``: nothing is written until an admin starts it; stopping it stops the writes."""
    path = tmp_path / "switched.jsonl"
    running = start_stack(record={"path": str(path), "on_start": False})
    body = {"model": "m-both", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

    def act(action: str) -> httpx.Response:
        return httpx.post(f"{running.url}/admin/api/record/{action}", headers=ADMIN, timeout=30)

    try:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            assert not path.exists()
            started = act("start")
            assert started.status_code == 200
            assert started.json()["record"] == {"path": str(path), "on": True}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            stopped = act("stop")
            assert stopped.json()["record"]["on"] is False
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            assert [e["action"] for e in stopped.json()["audit"][:2]] == ["stop-recording", "record"]
            assert act("pause").status_code == 404
    finally:
        stop_stack(running)
    assert len(read_trace(path)) == 1  # only the request between start and stop


def test_recording_without_a_path_is_refused_clearly() -> None:
    running = start_stack()
    try:
        refused = httpx.post(f"{running.url}/admin/api/record/start", headers=ADMIN, timeout=30)
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == "set record.path in the config to record traffic"
        policy = httpx.get(f"{running.url}/admin/api/policy", headers=ADMIN, timeout=30).json()
        assert policy["record"] == {"path": None, "on": False}
    finally:
        stop_stack(running)
