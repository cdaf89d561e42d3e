"""``sim_main`` argument parsing (no server is started) and the config defaults it relies on."""

from __future__ import annotations

import pytest

from backends.sim import SimConfig
from backends.sim.cli import parse_args
from policies.types import Architecture
from tests.backends.sim.simhelp import running, user


class TestParseArgs:
    def test_full_command_line(self) -> None:
        """Every option lands in the SimConfig; argv[0] is the kind."""
        argv = [
            "llamacpp", "--port", "9001", "--host", "0.0.0.0", "--model", "qwen", "--context-window", "8192",
            "--slots", "4", "--time-scale", "0.5", "--prefill-tok-s", "1000", "--decode-tok-s", "50",
            "--architecture", "dense", "--no-prefix-caching", "--block-size", "512", "--api-key", "k",
            "--load-seconds", "2", "--batch-slowdown", "0",
        ]  # fmt: skip
        options = parse_args(argv)
        config = options.config
        assert (options.host, options.port) == ("0.0.0.0", 9001)
        assert (config.kind, config.model, config.context_window, config.slots) == (
            "llamacpp",
            "qwen",
            8192,
            4,
        )
        assert (config.time_scale, config.prefill_tok_s, config.decode_tok_s) == (0.5, 1000.0, 50.0)
        assert config.architecture is Architecture.DENSE
        assert config.prefix_caching is False
        assert (config.block_size, config.api_key, config.load_seconds) == (512, "k", 2.0)
        assert config.batch_slowdown == 0.0

    def test_an_engine_profile_by_name(self) -> None:
        config = parse_args(
            ["llamacpp", "--port", "1", "--engine-profile", "h200-llamacpp-flash-next-shape-pinned"]
        ).config
        assert config.engine_profile.name == "h200-llamacpp-flash-next-shape-pinned"
        assert config.prefill_chunk == 4096  # the profile's batch

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["vllm", "--engine-profile", "seed-5090-llamacpp-27b"], "is a llamacpp profile, not vllm"),
            (["vllm", "--engine-profile", "nope"], "no engine profile named 'nope'"),
        ],
    )
    def test_a_wrong_engine_profile_is_refused(
        self, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exit_info:
            parse_args([*argv, "--port", "1"])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err

    def test_defaults_per_kind(self) -> None:
        """Unset speeds take the engine's defaults (vLLM 6600/64, llama.cpp 3000/109)."""
        vllm = parse_args(["vllm", "--port", "1"]).config
        llama = parse_args(["llamacpp", "--port", "1"]).config
        assert (vllm.prefill_tok_s, vllm.decode_tok_s, vllm.prefix_caching) == (6600.0, 64.0, True)
        assert (llama.prefill_tok_s, llama.decode_tok_s, llama.slots) == (3000.0, 109.0, 2)
        assert parse_args(["vllm", "--port", "1"]).host == "127.0.0.1"

    def test_bad_kind_exits(self) -> None:
        """An unknown kind is a usage error."""
        with pytest.raises(SystemExit):
            parse_args(["tgi", "--port", "1"])

    def test_config_rejects_nonsense(self) -> None:
        """SimConfig validates its own fields."""
        with pytest.raises(ValueError, match="slots"):
            SimConfig(slots=0)


class TestEventsEndpoint:
    def test_events_json(self) -> None:
        """GET /_sim/events lists the lifecycle events as JSON."""
        with running("llamacpp") as (client, _):
            client.post("/v1/chat/completions", json={"messages": [user("hi")], "max_tokens": 2})
            events = client.get("/_sim/events").json()
            assert [e["kind"] for e in events] == ["start", "finish"]
            assert set(events[0]) == {
                "kind",
                "request_id",
                "at",
                "prompt_tokens",
                "cached_tokens",
                "completion_tokens",
                "slot",
            }
            assert events[1]["completion_tokens"] == 2
            assert events[0]["slot"] == 1
