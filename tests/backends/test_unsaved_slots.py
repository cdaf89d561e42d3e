"""Which llama.cpp slots the next launch copies into the RAM cache (``SlotState.unsaved``): llama-server
saves every idle slot after each task launch (``--cache-idle-slots``), so a slot whose request ended
after the latest launch on its backend waits to be saved, and the request launched next waits for it
(``policies.pricing.ram_saves_s``)."""

from __future__ import annotations

import httpx

from backends.base import BackendSpec
from backends.clock import VirtualClock
from backends.fleet import Fleet
from backends.sent import Sent
from policies import EngineKind, Health, SlotState

NOW = 1_000_000.0


def two_slots() -> Fleet:
    fleet = Fleet([BackendSpec("llama", EngineKind.LLAMACPP, "http://127.0.0.1:9")], httpx.AsyncClient(),
                  clock=VirtualClock(NOW, epoch=0.0))  # fmt: skip
    snapshot = fleet.snapshots()[0]
    slots = (SlotState(0, 4096, False), SlotState(1, 4096, False))
    fleet.observe(
        snapshot.__class__("llama", EngineKind.LLAMACPP, Health.READY, NOW - 1, slots=slots, total_slots=2)
    )
    return fleet


def unsaved(fleet: Fleet) -> list[int]:
    return [s.unsaved for s in fleet.snapshots()[0].slots]


def test_a_slot_left_after_the_latest_launch_is_saved_by_the_next() -> None:
    fleet = two_slots()
    assert unsaved(fleet) == [0, 0]  # nothing ran: nothing to save
    first = fleet.begin(Sent("llama", 0, NOW - 5, prompt_tokens=900))
    assert unsaved(fleet) == [0, 0]  # busy
    fleet.end(first)  # at NOW, after the latest launch (NOW - 5)
    assert unsaved(fleet) == [900, 0]
    fleet.observe(fleet.snapshots()[0].__class__(
        "llama", EngineKind.LLAMACPP, Health.READY, NOW + 3, total_slots=2,
        slots=(SlotState(0, 4096, False), SlotState(1, 4096, False)),
    ))  # fmt: skip
    assert unsaved(fleet) == [900, 0]  # a probe does not save it: a launch does
    fleet.begin(Sent("llama", 1, NOW + 1))  # this launch copied slot 0 into the RAM cache
    assert unsaved(fleet) == [0, 0]


def test_a_request_the_engine_placed_itself_marks_no_slot() -> None:
    fleet = two_slots()
    fleet.end(fleet.begin(Sent("llama", None, NOW - 5)))
    assert unsaved(fleet) == [0, 0]


def test_a_token_count_launches_nothing_and_saves_nothing() -> None:
    """llama-server answers a count in its HTTP thread: no task starts, no idle slot is saved."""
    fleet = two_slots()
    fleet.end(fleet.begin(Sent("llama", 0, NOW - 5, prompt_tokens=900)))
    fleet.begin(Sent("llama", None, NOW + 1, holds=False))
    assert unsaved(fleet) == [900, 0]
