"""Calibrate's probe of a context checkpoint's restore and take (``backends.calibrate.restore``), held
against the simulated llama-server in virtual time (the real one is run by
``tests/real/test_calibrate.py``): it recovers the engine's restore and the cost of a checkpoint taken
exactly, with the saves the probe's requests waited for taken out, and says when nothing was restored."""

from __future__ import annotations

import asyncio

import pytest
from msgspec.structs import replace

from backends.calibrate import restore
from backends.calibrate.saves import SlotBook
from policies.engine_profile import EngineProfile
from policies.types import Architecture
from tests.backends.test_calibrate_saves import PROFILE, TRUTH, Engine, sender

RESTORE_S = 0.12  # about what the H100's 27B warm turns paid beyond their tokens
TAKE_S = 0.125  # a checkpoint taken on the H100's 27B (150 MiB copied off the GPU)


def truth(restore_s: float, take_s: float = 0.0) -> EngineProfile:
    cache = replace(PROFILE.cache, checkpoint_restore_s=restore_s)
    return replace(PROFILE, cache=cache, prefill=replace(PROFILE.prefill, checkpoint_s=take_s))


def probe(
    restore_s: float, take_s: float = 0.0, architecture: Architecture = Architecture.HYBRID
) -> restore.Checkpoints | None:
    profile = truth(restore_s, take_s)
    engine, book = Engine(profile=profile, architecture=architecture), SlotBook()
    send = sender(engine, book)
    asyncio.run(send(engine.prompt(3000), 0))  # slot 0 not saved yet: the probe's first launch saves it
    tokens_s = PROFILE.prefill_seconds  # what calibrate's fit so far prices tokens at (no checkpoints)
    return asyncio.run(restore.measure(send, engine.prompt, TRUTH.without, tokens_s))


def test_it_recovers_the_restore_with_the_saves_taken_out() -> None:
    paying, free = probe(RESTORE_S), probe(0.0)
    assert paying is not None
    assert free is not None
    assert paying.restore_s - free.restore_s == pytest.approx(RESTORE_S, rel=1e-6)
    assert free.restore_s < 0.002  # two more tokens re-processed: the rest of the difference


def test_it_recovers_a_checkpoint_taken_beside_the_restore() -> None:
    """Each round's 16-token turn takes two checkpoints, its 4-token turn one: the difference, less
    12 tokens at the fit's price, is one checkpoint; the restore comes out as before."""
    measured = probe(RESTORE_S, TAKE_S)
    assert measured is not None
    assert measured.take_s == pytest.approx(TAKE_S, rel=1e-6)
    assert measured.restore_s == pytest.approx(RESTORE_S, abs=0.002)
    without = probe(RESTORE_S)
    assert without is not None
    assert without.take_s == pytest.approx(0.0, abs=1e-9)


def test_a_model_without_recurrent_state_restores_nothing() -> None:
    assert probe(RESTORE_S, TAKE_S, Architecture.DENSE) is None


def test_a_one_slot_server_is_probed_on_its_only_slot() -> None:
    engine, book = Engine(profile=truth(RESTORE_S, TAKE_S)), SlotBook()
    send = sender(engine, book)
    tokens_s = PROFILE.prefill_seconds
    paying = asyncio.run(restore.measure(send, engine.prompt, TRUTH.without, tokens_s, slot=0))
    assert paying is not None
    assert paying.restore_s == pytest.approx(RESTORE_S, abs=0.002)
    assert paying.take_s == pytest.approx(TAKE_S, abs=0.002)


def test_a_book_for_a_model_without_recurrent_state_counts_no_checkpoints() -> None:
    book = SlotBook(hybrid=False)
    book.launch(list(range(3000)), 0)
    assert book.launch(list(range(5000, 5100)), 1) == ((3000, 0),)
