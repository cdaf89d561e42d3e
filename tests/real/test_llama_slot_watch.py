"""A real llama-server (the pinned build, CPU) that clears idle slots: ``--kv-unified`` with the
default ``--cache-idle-slots`` empties slot 0 when slot 1 starts a task, and a request that names slot
0 again reuses nothing. ``turnout config check`` and the probe say so (``backends.slot_watch``);
without ``--kv-unified`` (compose's flags) the slot keeps its cache and the check passes."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backends.slot_watch import CLEARED_IDLE_SLOTS
from gateway.core import build_core, one_replica
from gateway.probe_check import check_backends
from gateway.settings import Settings, load_settings
from tests.real.llama_server import DEFAULT_ALIAS, LlamaServer, LlamaServerFactory

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

WORDS = "alpha beta gamma delta " * 40


def settings_for(server: LlamaServer) -> Settings:
    return load_settings(
        None,
        backends=[{"id": "llama", "kind": "llamacpp", "url": server.base_url, "timeouts": {"probe": 10.0}}],
        models=[
            {
                "name": "tiny",
                "architecture": "hybrid",
                "deployments": [{"backend": "llama", "upstream_name": DEFAULT_ALIAS}],
            }
        ],
    )


def cached_on(server: LlamaServer, slot: int, prompt: str) -> int:
    body = {"prompt": prompt, "n_predict": 2, "id_slot": slot, "cache_prompt": True}
    answer = httpx.post(server.base_url + "/completion", json=body, timeout=60).json()
    return int(answer["timings"]["cache_n"])


@pytest.mark.parametrize("unified", [True, False], ids=["kv-unified", "compose"])
def test_config_check_fails_a_server_that_clears_idle_slots(
    llama_server: LlamaServerFactory, unified: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    server = llama_server(extra_args=["--kv-unified"] if unified else [])
    code = asyncio.run(check_backends(settings_for(server)))
    out = capsys.readouterr().out
    if unified:
        assert code == 3, out
        assert CLEARED_IDLE_SLOTS in out
    else:
        assert code == 0, out
        assert "slots keep their cache" in out


@pytest.mark.parametrize("unified", [True, False], ids=["kv-unified", "compose"])
def test_the_probe_sees_a_slot_cleared_while_idle(llama_server: LlamaServerFactory, unified: bool) -> None:
    """Slot 0 answers, a probe, slot 1 answers, a probe: on the unified server slot 0 held its prompt
    and then nothing, and coming back to it reuses nothing; the probe's snapshot says why."""
    server = llama_server(extra_args=["--kv-unified"] if unified else [])

    async def run() -> tuple[int, tuple[str, ...]]:
        async with httpx.AsyncClient() as http:
            core = build_core(one_replica(settings_for(server)), client=http, record=False)
            await asyncio.to_thread(cached_on, server, 0, WORDS)
            await core.fleet.probe_all()
            await asyncio.to_thread(cached_on, server, 1, "zeta eta theta " * 40)
            (snapshot,) = await core.fleet.probe_all()
            back = await asyncio.to_thread(cached_on, server, 0, WORDS + " and more words")
            return back, snapshot.warnings

    back, warnings = asyncio.run(run())
    if unified:
        assert (back, warnings) == (0, (CLEARED_IDLE_SLOTS,))
    else:
        assert back > 100
        assert warnings == ()
