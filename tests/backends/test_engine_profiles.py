"""Engine profile files: the built-ins, TOML round trips, and what a config may name."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from backends.engine_profiles import (
    BUILTIN_DIR,
    ProfileNotFound,
    builtin_names,
    dump_profile,
    load_profile,
    save_profile,
)
from backends.sim.config import SimConfig
from policies.engine_profile import Check, Point, ProfileSchemaError
from policies.learning import PRIOR_DECODE, PRIOR_PREFILL
from policies.types import EngineKind

REPO = Path(__file__).resolve().parents[2]


class TestBuiltins:
    def test_every_builtin_loads_and_deploy_profiles_is_the_same_folder(self) -> None:
        assert len(builtin_names()) >= 5
        for name in builtin_names():
            assert load_profile(name).name == name
        assert (REPO / "deploy" / "profiles").resolve() == BUILTIN_DIR

    def test_the_default_profiles_are_the_priors_the_router_starts_from(self) -> None:
        """One source of the numbers: the simulators' defaults are the seed profiles, and the router's
        priors for a deployment without a profile are the same rates."""
        vllm, llama = SimConfig(kind="vllm"), SimConfig(kind="llamacpp")
        assert (vllm.prefill_tok_s, vllm.decode_tok_s) == pytest.approx(
            (PRIOR_PREFILL[EngineKind.VLLM], PRIOR_DECODE[EngineKind.VLLM])
        )
        assert (llama.prefill_tok_s, llama.decode_tok_s) == pytest.approx(
            (PRIOR_PREFILL[EngineKind.LLAMACPP], PRIOR_DECODE[EngineKind.LLAMACPP])
        )

    def test_a_simulator_given_a_profile_runs_on_it(self) -> None:
        profile = load_profile("workstation-llamacpp-flash-next-cpu-moe")
        config = SimConfig(kind="llamacpp", profile=profile, prefill_tok_s=9999)
        assert config.engine_profile is profile
        assert config.prefill_tok_s == pytest.approx(profile.prefill_tok_s())  # a profile wins over rates
        assert config.prefill_chunk == profile.prefill.batch


class TestFiles:
    def test_save_and_load_keep_everything(self, tmp_path: Path) -> None:
        base = load_profile("workstation-llamacpp-flash-next-cpu-moe")

        profile = msgspec.structs.replace(
            base,
            prefill_points=(Point(512, 0, 6.5), Point(4096, 0, 51.2)),
            decode_points=(Point(1, 100, 0.028),),
            checks=(Check("ram", 8000, 7996, 0.25, 99.0, 0.3),),
            notes=("coarse grid: the budget allowed 4 prompts",),
        )
        path = save_profile(profile, tmp_path / "p.toml", header=["measured by a test"])
        assert path.read_text().startswith("# measured by a test\n")
        assert load_profile(path) == profile

    def test_unknown_names_and_bad_files_say_what_is_wrong(self, tmp_path: Path) -> None:
        with pytest.raises(ProfileNotFound, match=r"built-in: .*seed-5090-vllm-27b"):
            load_profile("no-such-profile")
        with pytest.raises(ProfileNotFound, match="does not exist"):
            load_profile(str(tmp_path / "missing.toml"))
        bad = tmp_path / "bad.toml"
        bad.write_text(dump_profile(load_profile("seed-5090-vllm-27b")).replace("schema = 1", "schema = 7"))
        with pytest.raises(ProfileSchemaError, match=r"bad\.toml: profile schema 7 is not supported"):
            load_profile(bad)
