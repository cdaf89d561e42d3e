"""bench/head_digest_experiment.py: sessions on one system prompt, with and without the head digest."""

from __future__ import annotations

import pytest

from tests.replay.bench_scripts import bench_scripts

(experiment,) = bench_scripts("head_digest_experiment")


def test_its_sessions_share_a_system_message_and_grow_as_agents_resend_them() -> None:
    requests = experiment.trace(0, system_tokens=200, sessions=5, gap_s=10.0, agent=True)
    assert all(r.messages is not None and r.agent for r in requests)
    systems = {r.messages[0]["content"] for r in requests if r.messages is not None}
    assert len(systems) == 1  # one system prompt for every session
    by_session: dict[str | None, list[int]] = {}
    for r in requests:
        assert r.messages is not None
        by_session.setdefault(r.session, []).append(len(r.messages))
    assert len(by_session) == 5
    assert all(lengths == list(range(2, 2 * len(lengths) + 1, 2)) for lengths in by_session.values())


def test_it_replays_both_variants_and_prints_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert experiment.main(["--system", "300", "--sessions", "3", "--draws", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["without", "with the head"]
    assert all("last token" in line for line in lines)
