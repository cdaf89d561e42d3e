"""The simulated llama-server stops for its RAM-cache saves (``cache.ram_save_s``), as the real one did
on the H100: with ``--cache-idle-slots`` every idle slot whose state is not in the RAM cache yet is
saved right after a task launches, and the request just launched waits for it; its own prompt time
(``prompt_ms``) does not count it. The measured turns (``bench/gpu/results/2026-12-06d-h100/
turns-27b-shape-q8_0-dense.json``): a session's first turn on slot 1 after another session's three on
slot 0 waited 0.6 s more than its prompt took, its next turns did not, and a fresh prompt on slot 0
after them waited 0.70 s more."""

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
from policies.types import Architecture

PROFILE = "h100-llamacpp-27b-shape-q8_0-dense"
SAVE_S, SAVE_TOKEN_S = 0.5425, 3.126e-05
"""The line through the H100 turns' two outliers: 0.605 s for a slot of 2,000 tokens, 0.684 s for 4,527
(the built-in profile carries none until the card is calibrated again: its request_s holds saves)."""


class Server:
    """A simulated llama-server of two slots in virtual time; each request pinned to its slot."""

    def __init__(self, saves: bool, checkpoint_s: float = 0.0) -> None:
        profile = load_profile(PROFILE)
        cache = msgspec.structs.replace(
            profile.cache,
            ram_save_s=SAVE_S if saves else 0.0,
            ram_save_token_s=SAVE_TOKEN_S if saves else 0.0,
            ram_save_checkpoint_s=checkpoint_s,
        )
        profile = msgspec.structs.replace(profile, cache=cache)
        config = SimConfig(
            kind="llamacpp", architecture=Architecture.HYBRID, context_window=65536, profile=profile
        )
        self.events = Events()
        self.engine = LlamaEngine(config, clock=self.events.clock)
        EventDriver(self.engine, self.events)
        self.fresh = 10_000_000

    def ask(self, prompt: list[int], slot: int, answer: int = 16) -> tuple[float, float, list[int]]:
        """The request's wait to its first token and its prompt time (seconds), and the conversation."""
        tokens = tuple(OutToken(self.fresh + i, "w", DeltaKind.TEXT) for i in range(answer))
        self.fresh += answer
        task = SimTask(f"t{self.fresh}", prompt, Answer(tokens, "length", None), id_slot=slot,
                       listener=lambda _: None)  # fmt: skip
        sent = self.events.now
        self.engine.submit(task)
        self.events.run()
        assert task.finished
        return (
            task.sim_prompt_end - sent,
            task.sim_prompt_end - task.sim_start,
            prompt + [t.id for t in tokens],
        )

    def words(self, n: int) -> list[int]:
        self.fresh += n
        return list(range(self.fresh - n, self.fresh))


def measured_pattern(saves: bool) -> list[tuple[float, float]]:
    """Three turns of one session on slot 0, three of another on slot 1, a fresh prompt on slot 0."""
    server = Server(saves)
    out = []
    for slot in (0, 1):
        conversation: list[int] = []
        for _ in range(3):
            wait, prompt_s, conversation = server.ask(conversation + server.words(400), slot)
            out.append((wait, prompt_s))
    wait, prompt_s, _ = server.ask(server.words(1000), 0)
    out.append((wait, prompt_s))
    return out


def test_a_launch_waits_for_the_idle_slots_it_saves_and_its_prompt_time_does_not() -> None:
    saving, free = measured_pattern(True), measured_pattern(False)
    extra = [round(s[0] - f[0], 6) for s, f in zip(saving, free, strict=True)]
    # slot 1's first turn saves slot 0's session; the fresh prompt saves slot 1's; nothing else is
    # new to the cache (slot 0's turns: slot 1 is empty; slot 1's later turns: slot 0 is saved). A
    # session's slot holds 3 x 400 words, two answers and the last one but its last token: 1,247
    save = round(SAVE_S + 1247 * SAVE_TOKEN_S, 6)
    assert extra == [0.0, 0.0, 0.0, save, 0.0, 0.0, save]
    assert [s[1] for s in saving] == pytest.approx([f[1] for f in free])  # prompt_ms: the prompt alone


def test_the_measured_line_goes_through_both_outliers() -> None:
    cache = msgspec.structs.replace(
        load_profile(PROFILE).cache, ram_save_s=SAVE_S, ram_save_token_s=SAVE_TOKEN_S
    )
    assert cache.ram_save_seconds(2000) == pytest.approx(0.605, abs=0.001)
    assert cache.ram_save_seconds(4527) == pytest.approx(0.684, abs=0.001)


def test_a_save_copies_each_context_checkpoint_the_slot_holds() -> None:
    """A hybrid slot's state carries its context checkpoints (a copy of the recurrent state each,
    ~150 MB at the 27B's shape): with ``ram_save_checkpoint_s`` a slot that held a conversation costs
    more to save than one that held one prompt of as many tokens (two checkpoints: N - 2,048 at the
    profile's micro-batch of 2,048, and N - 4)."""
    per_checkpoint = 0.1

    def save_of(turns: int, checkpoint_s: float) -> tuple[float, int]:
        """Slot 0 holds a conversation of ``turns`` turns; what slot 1's first request waits for."""
        server = Server(True, checkpoint_s)
        conversation: list[int] = []
        for _ in range(turns):
            _, _, conversation = server.ask(conversation + server.words(2400 // turns), 0, answer=1)
        count = len(server.engine.slots[0].checkpoints)
        wait, prompt_s, _ = server.ask(server.words(100), 1, answer=1)
        return wait - prompt_s, count

    (one, one_count), (one_free, _) = save_of(1, per_checkpoint), save_of(1, 0.0)
    (three, three_count), (three_free, _) = save_of(3, per_checkpoint), save_of(3, 0.0)
    # two near the end of each prompt, but the first of three: 800 tokens, within the gap of 2,048
    assert (one_count, three_count) == (2, 5)
    assert one - one_free == pytest.approx(2 * per_checkpoint)
    assert three - three_free == pytest.approx(5 * per_checkpoint)
