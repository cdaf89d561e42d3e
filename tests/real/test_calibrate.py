"""``turnout calibrate`` against the real engines the suite builds (tiny models: the procedure, the
schema and the refusals are what is tested, not the numbers)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import httpx
import pytest

from backends.engine_profiles import load_profile
from gateway.cli import main
from tests.real.llama_server import LlamaServerFactory
from tests.real.vllm_conftest_fixtures import VllmServerFactory

pytestmark = pytest.mark.timeout(600)


@pytest.mark.real_llama
class TestLlamaServer:
    def test_it_measures_the_grid_and_the_restores_and_writes_a_profile(
        self, llama_server: LlamaServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        server = llama_server(n_parallel=2, ctx_total=8192, extra_args=["--cache-ram", "64"])
        out = tmp_path / "tiny.toml"
        code = main(["calibrate", server.base_url, "--out", str(out), "--budget", "3m", "--seed", "1",
                     "--machine", "cpu=the test machine"])  # fmt: skip
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert "[####################]" in captured.err  # the progress bar reached its end
        profile = load_profile(out)
        assert (profile.engine, profile.name, profile.context_window) == ("llamacpp", "tiny", 4096)
        assert dict(profile.machine) == {"cpu": "the test machine"}
        assert len(profile.prefill_points) >= 7
        assert any(p.b > 0 for p in profile.prefill_points)  # prefills after cached tokens
        assert profile.prefill.checkpoint_splits
        assert profile.prefill.ubatch == 512
        assert {p.a for p in profile.decode_points} == {1, 2}
        checks = {c.name: c for c in profile.checks}
        assert set(checks) == {"warm", "checkpoint", "ram"}
        assert checks["warm"].cached >= 1000  # the turn before it stays on the slot
        assert (
            0 < checks["checkpoint"].cached < checks["checkpoint"].prompt
        )  # from a checkpoint before the edit
        assert (
            checks["ram"].cached >= 2000
        )  # back from the RAM cache after another conversation took the slot
        assert profile.cache.ram_restore_token_s >= 0
        # the RAM-cache saves were timed (two slots, --cache-ram on) and taken out of the prefill points
        assert not [n for n in profile.notes if "saves not timed" in n]
        assert profile.cache.ram_save_s >= 0  # a tiny model's save is well under a millisecond: maybe 0
        assert profile.cache.ram_save_token_s >= 0
        # the tiny hybrid model restored and took context checkpoints in the probe (their costs may round
        # to 0)
        assert not [n for n in profile.notes if "checkpoints not timed" in n or "no context checkpoint" in n]
        # the profile prices each restore below a cold prefill of the same prompt (what the engine took
        # is data, not a verdict: on a busy machine one scenario can take longer than the cold estimate)
        assert all(c.predicted_s < c.cold_seconds for c in checks.values())
        assert "wrote" in captured.out
        assert "warm" in captured.out
        assert "ram      save" in captured.out
        assert "checkpoint  taken" in captured.out
        # it leaves no calibration prompt in the slots it used
        slots = httpx.get(server.base_url + "/slots").json()
        assert all(s.get("n_ctx") and len(s.get("prompt", "") or "") < 100 for s in slots)

    def test_it_refuses_a_busy_engine(
        self, llama_server: LlamaServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        server = llama_server(n_parallel=1, ctx_total=4096)
        started = threading.Event()

        def generate() -> None:
            body = {"prompt": "go", "n_predict": 3000, "ignore_eos": True, "stream": True}
            try:
                with httpx.stream("POST", server.base_url + "/completion", json=body, timeout=120) as r:
                    for _ in r.iter_lines():
                        started.set()
            except httpx.HTTPError:
                pass  # the server stops at the end of the test, mid-stream

        worker = threading.Thread(target=generate, daemon=True)
        worker.start()
        assert started.wait(60)
        code = main(["calibrate", server.base_url, "--out", str(tmp_path / "x.toml"), "--budget", "30s"])
        assert code == 2
        assert "the engine is busy (1 request(s) running or queued)" in capsys.readouterr().err
        assert not (tmp_path / "x.toml").exists()


def test_it_refuses_an_unreachable_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        code = main(["calibrate", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "x.toml")])
    assert code == 2
    assert f"cannot reach http://127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.real_vllm
def test_vllm_prefill_decode_and_prefix_blocks(
    vllm_server: VllmServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = vllm_server(max_model_len=2048, extra_args=["--enable-prefix-caching"])
    out = tmp_path / "vllm.toml"
    code = main(["calibrate", server.base_url, "--out", str(out), "--budget", "4m", "--batch", "2048"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    profile = load_profile(out)
    assert profile.engine == "vllm"
    assert profile.context_window == 2048
    assert len(profile.prefill_points) >= 5
    assert profile.decode_points
    prefix = [c for c in profile.checks if c.name == "prefix"]
    assert prefix, profile.notes
    # a hybrid model's prompt is reused in whole blocks, or not at all: the profile says which
    assert all(c.cached % max(profile.cache.prefix_block, 1) == 0 for c in prefix)
    assert (profile.cache.prefix_block > 0) == all(c.cached > 0 for c in prefix)
