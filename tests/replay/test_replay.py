"""A tiny replay end to end: two profiles and the oracle over real simulators, with a JSON report."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.cli import build_parser, main
from gateway.replay.generate import mixed_trace
from gateway.replay.report import REPORT_KEYS, median_report, percentile, report
from gateway.replay.results import ORACLE
from gateway.replay.runner import ReplayOptions, run_replay
from gateway.replay.traces import conversations, write_trace
from gateway.replay.workstation import StackOptions

SCALE = 0.02


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One agent (3 turns, 2k -> 6k tokens) and 4 chat requests over 6 simulated seconds."""
    path = tmp_path_factory.mktemp("replay") / "tiny.jsonl"
    requests = mixed_trace(agents=1, turns=3, requests=4, duration=6.0, seed=5, max_context=6000)
    with path.open("w") as handle:
        write_trace(requests, handle)
    return path


class TestReplay:
    def test_report_has_the_documented_keys_and_sane_values(
        self, tmp_path: Path, trace_file: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr("gateway.logging.configure_logging", lambda *args, **kwargs: None)
        out = tmp_path / "report.json"
        argv = ["replay", str(trace_file), "--clock", "wall", "--profile", "cost", "--profile", "prefer-vllm"]
        code = main([*argv, "--time-scale", str(SCALE), "--json", str(out), "--wall-cap", "60"])
        assert code == 0
        data = json.loads(out.read_text())
        assert set(data["profiles"]) == {"cost", "prefer-vllm", ORACLE}
        assert data["meta"]["requests"] == 7
        for name, entry in data["profiles"].items():
            assert tuple(entry) == REPORT_KEYS, name
            assert (entry["requests"], entry["errors"]) == (7, 0), name
            assert 0 < entry["ttft_p50_s"] <= entry["ttft_p90_s"], name
            assert entry["ttft_mean_s"] < entry["completion_mean_s"], name
            assert 0 <= entry["cache_hit_ratio"] <= 1, name
            assert sum(entry["backend_share"].values()) == pytest.approx(1.0, abs=1e-3)
            assert set(entry["backend_share"]) <= {"vllm", "llama"}
        assert data["profiles"]["prefer-vllm"]["backend_share"] == {"vllm": 1.0}
        assert data["profiles"]["prefer-vllm"]["cache_hit_ratio"] > 0  # vLLM 0.25: whole blocks of a hybrid

    def test_sessions_are_sequential(self, trace_file: Path) -> None:
        from gateway.replay.traces import read_trace

        requests = read_trace(trace_file)
        runs = run_replay(
            requests, [], StackOptions(time_scale=SCALE), ReplayOptions(time_scale=SCALE, wall_cap_s=60)
        )
        results = runs[ORACLE]
        agent = [r for r in results if r.session is not None]
        assert len(agent) == 3
        assert all(r.ok for r in results)
        for previous, current in itertools.pairwise(agent):
            assert current.start_s >= previous.end_s - 0.5  # tolerance: wall-clock jitter / time scale
        assert report(runs)["profiles"][ORACLE]["requests"] == 7


class TestPieces:
    def test_groups_keep_session_turns_together(self, trace_file: Path) -> None:
        from gateway.replay.traces import read_trace

        requests = read_trace(trace_file)
        grouped = conversations(requests)
        assert sorted(i for g in grouped for i in g) == list(range(len(requests)))
        assert sorted(len(g) for g in grouped) == [1, 1, 1, 1, 3]

    def test_session_less_conversations_are_paced_like_sessions(self) -> None:
        """Without session ids (Mooncake format) a turn that resends a previous turn's whole prompt
        waits for it, as an agent would; requests that only share a system prompt stand alone."""
        from gateway.replay.generate import contention_trace, without_sessions

        requests = contention_trace(agents=3, turns=4, seed=2, oneshot_every=2.0)
        with_ids = sorted(sorted(g) for g in conversations(requests))
        assert sorted(sorted(g) for g in conversations(without_sessions(requests))) == with_ids
        assert sorted(len(g) for g in with_ids if len(g) > 1) == [4, 4, 4]

    def test_median_report_takes_each_numbers_median_but_keeps_every_error(self) -> None:
        def run(ttft: float, errors: int, share: dict[str, float]) -> dict[str, object]:
            entry = dict.fromkeys(REPORT_KEYS)
            entry.update(requests=10 - errors, errors=errors, ttft_mean_s=ttft, backend_share=share)
            return {"meta": {}, "profiles": {"cost": entry}}

        merged = median_report(
            [
                run(3.0, 0, {"llama": 1.0}),
                run(9.0, 2, {"llama": 0.5, "vllm": 0.5}),
                run(4.0, 0, {"vllm": 1.0}),
            ],
            {"runs": 3},
        )
        cost = merged["profiles"]["cost"]
        assert merged["meta"] == {"runs": 3}
        assert (cost["ttft_mean_s"], cost["requests"], cost["errors"]) == (4.0, 10, 2)
        assert cost["backend_share"] == {"llama": 0.5, "vllm": 0.5}
        assert cost["ttft_p90_s"] is None

    def test_nearest_rank_percentile(self) -> None:
        assert percentile([], 0.5) is None
        assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
        assert percentile([3.0, 1.0, 2.0, 4.0], 0.9) == 4.0


class TestCli:
    @pytest.mark.parametrize(
        "argv",
        [
            ["trace", "contention", "--agents", "0"],
            ["trace", "contention", "--turns", "-2"],
            ["trace", "contention", "--oneshot-every", "-1"],
            ["replay", "t.jsonl", "--llama-slots", "0"],
        ],
    )
    def test_out_of_range_numbers_are_usage_errors(
        self, argv: list[str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(argv)
        assert exited.value.code == 2
        assert "must" in capsys.readouterr().err

    def test_replay_arguments(self) -> None:
        args = build_parser().parse_args(
            ["replay", "t.jsonl", "--format", "mooncake", "--profile", "cost", "--profile", "round-robin",
             "--time-scale", "0.1", "--limit", "50", "--scale-tokens", "0.25", "--json", "out.json",
             "--model", "m"]
        )  # fmt: skip
        assert args.profile == ["cost", "round-robin"]
        assert (args.format, args.time_scale, args.limit, args.scale_tokens) == ("mooncake", 0.1, 50, 0.25)
        assert (args.json, args.model, args.trace) == (Path("out.json"), "m", Path("t.jsonl"))

    def test_trace_arguments_and_output(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        args = build_parser().parse_args(["trace", "mixed", "--agents", "3", "--turns", "4", "--seed", "9"])
        assert (args.kind, args.agents, args.turns, args.seed) == ("mixed", 3, 4, 9)
        assert main(["trace", "agent", "--agents", "2", "--turns", "3"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 6
        assert all(json.loads(line)["session"] for line in lines)
        out = tmp_path / "chat.jsonl"
        assert main(["trace", "chat", "--requests", "5", "--out", str(out)]) == 0
        assert len(out.read_text().splitlines()) == 5

    def test_unknown_profile_and_missing_trace_exit_2(self, tmp_path: Path) -> None:
        assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
        assert main(["replay", str(tmp_path / "nope.jsonl"), "--profile", "fastest"]) == 2

    def test_a_recording_of_several_models_replays_the_one_named(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A demo recording names each request's model: a replay runs one model's engines, so it
        replays the requests of the model ``--model`` names (else the most requested one), says so,
        and refuses a model the trace does not name (``--model nope`` exited 0 with the first model's
        numbers under its name; every request was replayed as that one model)."""
        both = [replace(r, model="qwen3.8-27b") for r in mixed_trace(agents=1, turns=2, requests=3, seed=1)]
        both += [replace(r, model="qwen3.8-flash-next") for r in mixed_trace(agents=0, requests=2, seed=2)]
        path = tmp_path / "recorded.jsonl"
        with path.open("w") as handle:
            write_trace(both, handle)
        capsys.readouterr()
        assert main(["replay", str(path), "--model", "nope", "--no-oracle"]) == 2
        said = capsys.readouterr().err
        assert (
            "--model nope: the trace names qwen3.8-27b (5 requests), qwen3.8-flash-next (2 requests)" in said
        )
        assert main(["replay", str(path), "--no-oracle"]) == 0
        assert "the 5 requests to qwen3.8-27b (the most requested model; --model picks another)" in (
            capsys.readouterr().err
        )
        out = tmp_path / "flash.json"
        args = ["replay", str(path), "--model", "qwen3.8-flash-next", "--no-oracle", "--json", str(out)]
        assert main(args) == 0
        said = capsys.readouterr().err
        assert "the 2 requests to qwen3.8-flash-next, on the default fleet: the 27B's engines" in said
        report = json.loads(out.read_text())
        assert report["meta"]["requests"] == 2
        assert report["meta"]["model"] == "qwen3.8-flash-next"
