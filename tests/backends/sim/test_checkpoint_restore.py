"""The simulated llama-server pays for restoring a context checkpoint (``cache.checkpoint_restore_s``),
as the real one did on the H100: a hybrid slot whose next prompt diverges inside what it holds (an
agent turn whose history is re-rendered) restores its newest checkpoint before the divergence, and
that copy is inside the request's own ``prompt_ms`` and stops every other slot too; a prompt that
extends the slot's tokens uses the live state and pays nothing for it."""

from __future__ import annotations

import msgspec
import pytest

from backends.clock import Events
from backends.engine_profiles import load_profile
from backends.sim.config import SimConfig
from backends.sim.drive import EventDriver
from backends.sim.generation import Answer, DeltaKind, OutToken
from backends.sim.llama_engine import LlamaEngine
from backends.sim.task import SimTask
from backends.sim.whatif import whatif_llama
from policies.types import Architecture

PROFILE = "h100-llamacpp-27b-shape-q8_0-dense"
RESTORE_S = 0.12


class Server:
    """Two slots in virtual time; each request pinned to its slot, answered with one token."""

    def __init__(
        self,
        restore_s: float,
        architecture: Architecture = Architecture.HYBRID,
        *,
        take_s: float | None = None,
    ) -> None:
        """``take_s``: a context checkpoint taken, at compose's 2,048-token micro-batches (None: the
        profile's own)."""
        profile = load_profile(PROFILE)
        cache = msgspec.structs.replace(profile.cache, checkpoint_restore_s=restore_s)
        prefill = profile.prefill
        if take_s is not None:
            prefill = msgspec.structs.replace(prefill, checkpoint_s=take_s, ubatch=2048, batch=2048)
        config = SimConfig(
            kind="llamacpp",
            architecture=architecture,
            context_window=65536,
            profile=msgspec.structs.replace(profile, cache=cache, prefill=prefill),
        )
        self.events = Events()
        self.engine = LlamaEngine(config, clock=self.events.clock)
        EventDriver(self.engine, self.events)
        self.fresh = 10_000_000

    def task(self, prompt: list[int], slot: int, answer: int = 1, user_start: int = -1) -> SimTask:
        tokens = tuple(OutToken(self.fresh + i, "w", DeltaKind.TEXT) for i in range(answer))
        self.fresh += answer
        return SimTask(f"t{self.fresh}", prompt, Answer(tokens, "length", None), id_slot=slot,
                       listener=lambda _: None, user_start=user_start)  # fmt: skip

    def ask(self, prompt: list[int], slot: int) -> SimTask:
        task = self.task(prompt, slot)
        self.engine.submit(task)
        self.events.run()
        assert task.finished
        return task

    def words(self, n: int) -> list[int]:
        self.fresh += n
        return list(range(self.fresh - n, self.fresh))


def turns(restore_s: float, architecture: Architecture = Architecture.HYBRID) -> list[tuple[int, float]]:
    """A conversation on slot 0: 2,000 tokens, extended by 400, then 400 more after dropping its last
    two tokens (a re-rendered history), then extended again: each turn's cached tokens and prompt time."""
    server = Server(restore_s, architecture)
    conversation = server.words(2000)
    first = server.ask(conversation, 0)
    out = [(first.cached, first.sim_prompt_end - first.sim_start)]
    for diverge in (False, True, False):
        if diverge:
            conversation = conversation[:-2]
        conversation = conversation + server.words(400)
        task = server.ask(conversation, 0)
        out.append((task.cached, task.sim_prompt_end - task.sim_start))
    return out


def test_a_diverging_turn_restores_a_checkpoint_inside_its_prompt_time() -> None:
    paying, free = turns(RESTORE_S), turns(0.0)
    assert [c for c, _ in paying] == [0, 2000, 2400 - 4, 2798]  # the checkpoint 4 before the end
    extra = [round(p - f, 6) for (_, p), (_, f) in zip(paying, free, strict=True)]
    assert extra == [0.0, 0.0, RESTORE_S, 0.0]


def test_a_model_without_recurrent_state_restores_nothing() -> None:
    paying, free = turns(RESTORE_S, Architecture.DENSE), turns(0.0, Architecture.DENSE)
    assert [c for c, _ in paying] == [0, 2000, 2398, 2798]  # all it shares
    assert [p for _, p in paying] == pytest.approx([f for _, f in free])


def test_every_slot_waits_for_the_restore() -> None:
    """Slot 1 decodes a long answer while slot 0 restores: its answer ends that much later."""

    def answer_end(restore_s: float) -> float:
        server = Server(restore_s)
        conversation = server.words(2000)
        server.ask(conversation, 0)
        long = server.task(server.words(500), 1, answer=200)
        server.engine.submit(long)
        server.ask(conversation[:-2] + server.words(400), 0)
        server.events.run()
        assert long.finished
        return long.sim_last

    assert answer_end(RESTORE_S) - answer_end(0.0) == pytest.approx(RESTORE_S)


def test_the_what_if_prices_the_restore_the_engine_then_pays() -> None:
    """``/_sim/whatif`` predicts the prompt time the engine takes, the restore included."""

    def predicted_and_paid(restore_s: float) -> tuple[float, float]:
        server = Server(restore_s)
        conversation = server.words(2000)
        server.ask(conversation, 0)
        diverging = conversation[:-2] + server.words(400)
        predicted = whatif_llama(server.engine, diverging, id_slot=0)
        task = server.ask(diverging, 0)
        return predicted.prefill_s, task.sim_prompt_end - task.sim_start

    predicted, paid = predicted_and_paid(RESTORE_S)
    assert predicted == pytest.approx(paid)
    assert predicted - predicted_and_paid(0.0)[0] == pytest.approx(RESTORE_S)
