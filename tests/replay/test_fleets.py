"""The virtual replay's fleet and pacing: rate scaling, the default workstation, fleets from a turnout
config, and ``turnout replay --clock virtual`` end to end on a config's backends."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from backends.sim import SimConfig
from gateway.cli import build_parser, main
from gateway.replay.fleets import capacity, default_fleet, sim_configs
from gateway.replay.generate import agent_trace
from gateway.replay.report import LOWER_BOUND
from gateway.replay.results import ORACLE
from gateway.replay.traces import TraceRequest, rate_for_load, read_trace, with_rate, write_trace
from gateway.replay.workstation import StackOptions
from gateway.settings import ConfigError, load_settings
from policies.types import Architecture


def req(t: float, tokens: int) -> TraceRequest:
    return TraceRequest(t, None, "m", tokens, (int(t * 1000),), 16)


class TestRate:
    def test_with_rate_divides_the_gaps_from_the_first_arrival(self) -> None:
        """Arrivals 10, 12, 20 at twice the rate: 10, 11, 15 (the first stays put)."""
        trace = [req(10.0, 100), req(12.0, 200), req(20.0, 300)]
        assert [r.t for r in with_rate(trace, 2.0)] == [10.0, 11.0, 15.0]
        assert [r.t for r in with_rate(trace, 0.5)] == [10.0, 14.0, 30.0]
        assert [r.input_tokens for r in with_rate(trace, 2.0)] == [100, 200, 300]

    @pytest.mark.parametrize("factor", [0.0, -1.0])
    def test_with_rate_refuses_a_factor_that_is_not_positive(self, factor: float) -> None:
        """A rate factor of 0 or less is a ValueError."""
        with pytest.raises(ValueError, match="positive"):
            with_rate([req(0.0, 1)], factor)

    def test_rate_for_load_puts_the_prompts_at_that_load(self) -> None:
        """load * capacity * span / tokens: 0.5 * 9600 * 10 / 6000 = 8; then 6000 tokens in 1.25 s is
        half of 9600 tok/s."""
        trace = [req(10.0, 1000), req(12.0, 2000), req(20.0, 3000)]
        factor = rate_for_load(trace, 0.5, 9600.0)
        assert factor == 8.0
        scaled = with_rate(trace, factor)
        span = scaled[-1].t - scaled[0].t
        assert span == 1.25
        assert sum(r.input_tokens for r in scaled) / (9600.0 * span) == 0.5

    def test_rate_for_load_of_a_trace_without_span(self) -> None:
        """One request (or all at once): nothing to compress, the factor is 1."""
        assert rate_for_load([req(3.0, 500)], 0.7, 1000.0) == 1.0
        assert rate_for_load([req(3.0, 500), req(3.0, 9)], 0.7, 1000.0) == 1.0


class TestDefaultFleet:
    @pytest.mark.parametrize("slots", [2, 3])
    def test_engine_models_equal_the_wall_replays(self, slots: int) -> None:
        """The virtual default fleet simulates exactly the wall replay's simulators (at scale 1)."""
        fleet = default_fleet("qwen", "cost", llama_slots=slots)
        virtual = sim_configs(fleet, "qwen")
        wall = StackOptions(model="qwen", time_scale=1.0, llama_slots=slots).sim_configs()
        # prefix_caching is a vLLM setting (the llama.cpp engine never reads it): left out for llama
        assert virtual["vllm"] == wall["vllm"]
        assert replace(virtual["llama"], prefix_caching=True) == replace(wall["llama"], prefix_caching=True)
        vllm, llama = virtual["vllm"], virtual["llama"]
        hybrid = Architecture.HYBRID
        assert (vllm.kind, vllm.model, vllm.context_window, vllm.architecture) == (
            "vllm",
            "qwen",
            94000,
            hybrid,
        )
        # vLLM 0.25 on the seed's rates: a hybrid model's prompts reused in whole 1,568-token blocks
        assert (vllm.prefill_tok_s, vllm.decode_tok_s, vllm.prefix_caching) == (6600.0, 64.0, True)
        assert (vllm.cache_block_size, vllm.engine_profile.align_block) == (1568, 1568)
        assert (llama.kind, llama.model, llama.context_window, llama.slots) == (
            "llamacpp",
            "qwen",
            65536,
            slots,
        )
        assert (llama.prefill_tok_s, llama.decode_tok_s, llama.architecture) == (3000.0, 109.0, hybrid)
        assert llama.cache_ram_mib == 8192

    def test_gateway_sees_the_windows_and_probes_every_2_s(self) -> None:
        """The gateway's deployments carry the engines' windows; probes every 2 simulated seconds."""
        fleet = default_fleet("qwen", "cost")
        windows = {d.backend: d.context_window for d in fleet.models[0].deployments}
        assert windows == {"vllm": 94000, "llama": 65536}
        assert [b.probe_interval_s for b in fleet.backends] == [2.0, 2.0]
        assert fleet.profile == "cost"


CONFIG = """
[[backends]]
id = "big-vllm"
kind = "vllm"
url = "http://127.0.0.1:9001"
  [backends.sim]
  prefix_caching = true
  prefill_tok_s = 8000
  decode_tok_s = 50
  max_num_seqs = 8

[[backends]]
id = "llama-a"
kind = "llamacpp"
url = "http://127.0.0.1:9002"
  [backends.sim]
  slots = 4
  prefill_tok_s = 2500
  decode_tok_s = 90
  prefill_chunk = 1024

[[backends]]
id = "llama-b"
kind = "llamacpp"
url = "http://127.0.0.1:9003"
  [backends.sim]
  slots = 1
  cache_ram_mib = 0
{extra_backend}
[[models]]
name = "coder"
aliases = ["c"]
architecture = "hybrid"

  [[models.deployments]]
  backend = "big-vllm"
  upstream_name = "org/Coder-FP8"
  context_window = 90000

  [[models.deployments]]
  backend = "llama-a"
  upstream_name = "coder-q4"
  context_window = 40000

[[models]]
name = "helper"
architecture = "moe"

  [[models.deployments]]
  backend = "llama-b"
  upstream_name = "helper-q8"
  context_window = 20000
"""

OPENAI_BACKEND = """
[[backends]]
id = "cloud"
kind = "openai"
url = "https://api.example.com"
"""


def write_config(tmp_path: Path, extra_backend: str = "") -> Path:
    path = tmp_path / "turnout.toml"
    path.write_text(CONFIG.format(extra_backend=extra_backend), encoding="utf-8")
    return path


class TestSimConfigs:
    def test_each_backend_takes_its_deployment_and_its_sim_table(self, tmp_path: Path) -> None:
        """Kind, upstream name and window of the deployment, the model's architecture, ``[backends.sim]``."""
        settings = load_settings(write_config(tmp_path))
        configs = sim_configs(settings, "coder", seed=7)
        assert configs == {
            "big-vllm": SimConfig(
                kind="vllm",
                model="org/Coder-FP8",
                context_window=90000,
                architecture=Architecture.HYBRID,
                prefix_caching=True,  # the sim table wins over the hybrid default (off)
                prefill_tok_s=8000.0,
                decode_tok_s=50.0,
                max_num_seqs=8,
                seed=7,
            ),
            "llama-a": SimConfig(
                kind="llamacpp",
                model="coder-q4",
                context_window=40000,
                architecture=Architecture.HYBRID,
                prefix_caching=False,  # hybrid, unset
                slots=4,
                prefill_tok_s=2500.0,
                decode_tok_s=90.0,
                prefill_chunk=1024,
                seed=7,
            ),
            # serves another model: its first deployment, that model's architecture
            "llama-b": SimConfig(
                kind="llamacpp",
                model="helper-q8",
                context_window=20000,
                architecture=Architecture.MOE,
                prefix_caching=True,  # not hybrid, unset
                slots=1,
                cache_ram_mib=0,
                seed=7,
            ),
        }
        assert configs["llama-b"].prefill_tok_s == 3000.0  # unset: the kind's default

    def test_an_alias_names_the_same_model(self, tmp_path: Path) -> None:
        """``c`` is an alias of ``coder``."""
        settings = load_settings(write_config(tmp_path))
        assert sim_configs(settings, "c") == sim_configs(settings, "coder")

    def test_every_sim_field_reaches_the_engine_model(self) -> None:
        """Each ``[backends.sim]`` field is a SimConfig field of the same name (none silently dropped)."""
        from gateway.settings import SimulatorConfig

        assert set(SimulatorConfig.model_fields) <= {f.name for f in fields(SimConfig)}

    def test_a_generic_openai_backend_is_refused_by_name(self, tmp_path: Path) -> None:
        """A replay simulates vllm and llamacpp only: an ``openai`` backend is a ConfigError naming it."""
        settings = load_settings(write_config(tmp_path, OPENAI_BACKEND))
        with pytest.raises(ConfigError, match="'cloud'"):
            sim_configs(settings, "coder")

    def test_an_unknown_model_lists_the_served_ones(self, tmp_path: Path) -> None:
        """Replaying a model the fleet does not serve: a ConfigError listing the models it serves."""
        settings = load_settings(write_config(tmp_path))
        with pytest.raises(ConfigError, match="'nope'; it serves coder, helper"):
            sim_configs(settings, "nope")

    def test_a_model_group_replays_on_each_members_deployments(self, tmp_path: Path) -> None:
        """A group over ``coder`` and ``helper``: every backend takes its member's deployment and that
        member's architecture (``llama-b`` serves ``helper``, a MoE), as when each is replayed alone."""
        path = write_config(tmp_path)
        path.write_text(
            path.read_text() + '\n[[groups]]\nname = "both"\nmembers = ["coder", "helper"]\naliases = ["b"]\n'
        )
        settings = load_settings(path)
        group = sim_configs(settings, "both")
        alone = sim_configs(settings, "coder")
        assert group == alone  # coder's two backends as before; llama-b's helper deployment either way
        assert group["llama-b"].architecture is Architecture.MOE
        assert sim_configs(settings, "b") == group
        assert (
            capacity(settings, "both", group)
            == capacity(settings, "coder", group) + group["llama-b"].prefill_tok_s
        )
        with pytest.raises(ConfigError, match="it serves coder, helper, both"):
            sim_configs(settings, "nope")


CLI_CONFIG = """
[[backends]]
id = "gpu"
kind = "vllm"
url = "http://127.0.0.1:9101"
  [backends.sim]
  prefill_tok_s = 5000

[[backends]]
id = "cpu-a"
kind = "llamacpp"
url = "http://127.0.0.1:9102"
  [backends.sim]
  slots = 2
  prefill_tok_s = 2000

[[backends]]
id = "cpu-b"
kind = "llamacpp"
url = "http://127.0.0.1:9103"
  [backends.sim]
  slots = 1
  prefill_tok_s = 1000

[[models]]
name = "coder"
architecture = "hybrid"

  [[models.deployments]]
  backend = "gpu"
  upstream_name = "coder-fp8"
  context_window = 30000

  [[models.deployments]]
  backend = "cpu-a"
  upstream_name = "coder-q4"
  context_window = 16000

  [[models.deployments]]
  backend = "cpu-b"
  upstream_name = "coder-q4"
  context_window = 16000
"""


class TestCli:
    @pytest.fixture
    def files(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
        monkeypatch.setattr("gateway.logging.configure_logging", lambda *args, **kwargs: None)
        trace = tmp_path / "agent.jsonl"
        with trace.open("w", encoding="utf-8") as handle:
            write_trace(agent_trace(agents=1, turns=3, max_context=6000), handle)
        config = tmp_path / "fleet.toml"
        config.write_text(CLI_CONFIG, encoding="utf-8")
        return trace, config

    def test_virtual_replay_on_a_configs_backends_at_a_load(
        self, files: tuple[Path, Path], tmp_path: Path
    ) -> None:
        """Exit 0; meta records the virtual clock, the config, the load and the rate it gives; every
        request completes, on the config's backends; a second run writes the same bytes."""
        trace, config = files
        out = tmp_path / "report.json"
        argv = ["replay", str(trace), "--backends", str(config), "--load", "0.7", "--profile", "cost"]
        assert main([*argv, "--json", str(out)]) == 0
        data = json.loads(out.read_text())
        requests = read_trace(trace)
        span = requests[-1].t - requests[0].t
        rate = 0.7 * (5000 + 2000 + 1000) * span / sum(r.input_tokens for r in requests)
        meta = data["meta"]
        assert (meta["clock"], meta["backends"], meta["load"]) == ("virtual", str(config), 0.7)
        assert meta["rate"] == round(rate, 6)
        assert (meta["model"], meta["requests"], meta["llama_slots"]) == ("coder", 3, None)
        assert list(data["profiles"]) == ["cost", ORACLE, LOWER_BOUND]
        for name in ("cost", ORACLE):
            entry = data["profiles"][name]
            assert (entry["requests"], entry["errors"]) == (3, 0), name
            assert entry["backend_share"], name
            assert set(entry["backend_share"]) <= {"gpu", "cpu-a", "cpu-b"}, name
            assert sum(entry["backend_share"].values()) == pytest.approx(1.0, abs=1e-3)
        assert data["profiles"][LOWER_BOUND]["requests"] == 3
        again = tmp_path / "again.json"
        assert main([*argv, "--json", str(again)]) == 0
        assert again.read_bytes() == out.read_bytes()  # the same trace and options: the same bytes

    def test_backends_with_the_wall_clock_exit_2(self, files: tuple[Path, Path]) -> None:
        """``--backends`` applies to the virtual clock only."""
        trace, config = files
        assert main(["replay", str(trace), "--clock", "wall", "--backends", str(config)]) == 2

    @pytest.mark.parametrize(
        "extra",
        [["--rate", "0"], ["--load", "-0.5"], ["--rate", "2", "--load", "0.5"]],
    )
    def test_bad_rate_or_load_is_a_usage_error(self, extra: list[str]) -> None:
        """A rate or load that is not positive, or both at once: argparse exits 2."""
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["replay", "t.jsonl", *extra])
        assert exited.value.code == 2
