"""Calibrate's probe of a context checkpoint's restore (``backends.calibrate.restore``), held against
the simulated llama-server in virtual time (the real one is run by ``tests/real/test_calibrate.py``):
it recovers the engine's restore exactly, with the saves the probe's requests waited for taken out,
and says when nothing was restored."""

from __future__ import annotations

import asyncio

import pytest
from msgspec.structs import replace

from backends.calibrate import restore
from backends.calibrate.saves import SlotBook
from policies.types import Architecture
from tests.backends.test_calibrate_saves import PROFILE, TRUTH, Engine, sender

RESTORE_S = 0.12  # about what the H100's 27B warm turns paid beyond their tokens


def probe(restore_s: float, architecture: Architecture = Architecture.HYBRID) -> float | None:
    profile = replace(PROFILE, cache=replace(PROFILE.cache, checkpoint_restore_s=restore_s))
    engine, book = Engine(profile=profile, architecture=architecture), SlotBook()
    send = sender(engine, book)
    asyncio.run(send(engine.prompt(3000), 0))  # slot 0 not saved yet: the probe's first launch saves it
    return asyncio.run(restore.measure(send, book, engine.prompt, TRUTH.without))


def test_it_recovers_the_restore_with_the_saves_taken_out() -> None:
    paying, free = probe(RESTORE_S), probe(0.0)
    assert paying is not None
    assert free is not None
    assert paying - free == pytest.approx(RESTORE_S, rel=1e-6)
    assert free < 0.002  # two more tokens re-processed: the rest of the difference


def test_a_model_without_recurrent_state_restores_nothing() -> None:
    assert probe(RESTORE_S, Architecture.DENSE) is None


def test_a_one_slot_server_is_probed_on_its_only_slot() -> None:
    profile = replace(PROFILE, cache=replace(PROFILE.cache, checkpoint_restore_s=RESTORE_S))
    engine, book = Engine(profile=profile), SlotBook()
    send = sender(engine, book)
    paying = asyncio.run(restore.measure(send, book, engine.prompt, TRUTH.without, slot=0))
    assert paying is not None
    assert paying == pytest.approx(RESTORE_S, abs=0.002)


def test_a_book_for_a_model_without_recurrent_state_counts_no_checkpoints() -> None:
    book = SlotBook(hybrid=False)
    book.launch(list(range(3000)), 0)
    assert book.launch(list(range(5000, 5100)), 1) == ((3000, 0),)
