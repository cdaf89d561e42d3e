"""What if (issue #29): the recording's last minutes replayed under every profile on an edited fleet,
from the admin API, give the very numbers ``turnout replay`` prints when run by hand."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import start_stack, stop_stack
from tests.servers import ADMIN


def converse(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        for session in ("whatif-a", "whatif-b"):
            messages = [{"role": "system", "content": f"You are {session}. " + "Rules. " * 900}]
            for turn in range(3):
                messages.append({"role": "user", "content": f"step {turn} " * 200})
                body = {"model": "m-both", "messages": messages, "max_tokens": 6}
                answer = client.post("/v1/chat/completions", json=body, headers={"x-session-id": session})
                assert answer.status_code == 200, answer.text
                messages.append(
                    {"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]}
                )
        for n in range(3):
            body = {
                "model": "m-both",
                "messages": [{"role": "user", "content": f"one-off {n}"}],
                "max_tokens": 4,
            }
            assert client.post("/v1/chat/completions", json=body).status_code == 200


def test_the_what_if_matches_turnout_replay_run_by_hand(tmp_path: Path) -> None:
    recording = tmp_path / "traffic.jsonl"
    mine = {"name": "mine", "scorers": {"ttft": 1.0}}  # a profile of its own: replayed too
    running = start_stack(record={"path": str(recording)}, profiles=[mine])
    try:
        converse(running.url)
        api = f"{running.url}/admin/api/whatif"
        form = httpx.get(api, headers=ADMIN, timeout=30).json()
        assert form["recording"] == str(recording)
        assert {b["id"]: b["slots"] for b in form["backends"]} == {"vllm": None, "llama": 2}  # as reported
        edits = {"minutes": 30, "copies": ["llama"], "slots": {"llama": 3}}
        answer = httpx.post(api, json=edits, headers=ADMIN, timeout=300)
        assert answer.status_code == 200, answer.text
        result = answer.json()
        for bad, message in [
            ({"remove": ["gpu9"]}, "no backend 'gpu9'"),
            ({"minutes": 0}, "minutes: 1 to 1440"),
            ({"colour": "red"}, "unknown field"),
        ]:
            refused = httpx.post(api, json=bad, headers=ADMIN, timeout=30)
            assert refused.status_code == 400
            assert message in refused.json()["error"]["message"]
        text = (recording.parent / "traffic.jsonl.whatif" / "fleet.toml").read_text()
        assert "llama-copy" in text
    finally:
        stop_stack(running)
    assert result["requests"] == 9
    assert result["model"] == "m-both"
    assert set(result["profiles"]) >= {"cost", "least-loaded", "prefer-vllm", "mine", "oracle", "lower-bound"}
    assert set(result["profiles"]["cost"]["backend_share"]) <= {"vllm", "llama", "llama-copy"}
    argv = shlex.split(result["command"])
    assert argv[:2] == ["turnout", "replay"]
    by_hand = tmp_path / "by-hand.json"
    argv[argv.index("--json") + 1] = str(by_hand)
    done = subprocess.run(
        [sys.executable, "-m", "gateway", *argv[1:]], capture_output=True, text=True, timeout=300
    )  # its own process: the CLI configures logging for the whole process
    assert done.returncode == 0, done.stderr
    assert json.loads(by_hand.read_text())["profiles"] == result["profiles"]


def test_leaving_a_what_if_mid_run_stops_it_and_the_next_one_runs(tmp_path: Path) -> None:
    """An admin who leaves the page while its replay runs stops that replay: the next what-if runs
    (issue #60 item 6: it was answered 409 until the abandoned one had finished)."""
    recording = tmp_path / "traffic.jsonl"
    running = start_stack(record={"path": str(recording)})
    try:
        converse(running.url)
        api = f"{running.url}/admin/api/whatif"
        report = recording.parent / "traffic.jsonl.whatif" / "report.json"
        with pytest.raises(httpx.ReadTimeout):  # the client gives up: its connection closes
            httpx.post(api, json={"minutes": 30}, headers=ADMIN, timeout=httpx.Timeout(30, read=0.3))
        time.sleep(5.0)  # what the abandoned replay (a child process starting up) would have needed
        assert not report.exists()  # it was stopped: it wrote no report (one left to run writes it)
        answer = httpx.post(api, json={"minutes": 30}, headers=ADMIN, timeout=300)
        assert answer.status_code == 200, answer.text
        assert answer.json()["requests"] == 9
    finally:
        stop_stack(running)
