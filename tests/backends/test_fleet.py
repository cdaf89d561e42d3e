"""The fleet's view: probe snapshots plus turnout's own requests sent since each probe."""

from __future__ import annotations

import time

import httpx
import pytest
from msgspec.structs import replace

from backends.base import BackendSpec
from backends.clock import VirtualClock
from backends.fleet import Fleet
from backends.inflight import ARRIVALS_WINDOW_S, RELEASE_LAG_S, STEP_LAG_S
from backends.load import Load
from backends.sent import OVERDUE_FLOOR, Sent
from policies import EngineKind, Health, SlotState

NOW = time.time()
"""The fleet's clock in these tests: predictions are measured against it, and a busy machine must not
move it between a request sent and the snapshot that counts it."""


@pytest.fixture
def fleet() -> Fleet:
    specs = [
        BackendSpec("llama", EngineKind.LLAMACPP, "http://127.0.0.1:9"),
        BackendSpec("vllm", EngineKind.VLLM, "http://127.0.0.1:9"),
    ]
    fleet = Fleet(specs, httpx.AsyncClient(), clock=VirtualClock(NOW, epoch=0.0))
    probed = NOW - 1
    for snapshot in fleet.snapshots():
        slots = (
            (SlotState(0, 4096, False), SlotState(1, 4096, False))
            if snapshot.kind is EngineKind.LLAMACPP
            else ()
        )
        fleet.observe(
            snapshot.__class__(
                snapshot.backend_id, snapshot.kind, Health.READY, probed, slots=slots,
                total_slots=len(slots) or None,
            )
        )  # fmt: skip
    return fleet


def by_id(fleet: Fleet) -> dict[str, object]:
    return {s.backend_id: s for s in fleet.snapshots()}


def sent(backend: str, slot: int | None, **predicted: float) -> Sent:
    return Sent(backend, slot, NOW, **predicted)


def test_requests_sent_since_the_probe_count_as_running(fleet: Fleet) -> None:
    first = fleet.begin(sent("llama", 0))
    fleet.begin(sent("llama", 1))
    fleet.begin(sent("llama", None))
    fleet.begin(sent("vllm", None))
    llama, vllm = (s for s in fleet.snapshots())
    assert (llama.running, llama.queued, vllm.running) == (2, 1, 1)
    assert [s.is_processing for s in llama.slots] == [True, True]
    fleet.end(first)
    llama = fleet.snapshots()[0]
    assert [s.is_processing for s in llama.slots] == [False, True]


def test_a_newer_probe_takes_over(fleet: Fleet) -> None:
    fleet.begin(sent("vllm", None))
    snapshot = fleet.snapshots()[1]
    assert snapshot.running == 1
    fleet.observe(snapshot.__class__("vllm", EngineKind.VLLM, Health.READY, NOW + 1, running=1))
    assert fleet.snapshots()[1].running == 1  # the probe's own count, not probe + turnout's


def test_a_slot_left_since_the_probe_is_idle_again(fleet: Fleet) -> None:
    """The probe saw turnout's request on slot 0; it has ended since: the slot is free."""
    token = fleet.begin(Sent("llama", 0, NOW - 5))  # began before the probe
    probed = fleet.snapshots()[0]
    fleet.observe(
        replace(probed, slots=(SlotState(0, 4096, True), SlotState(1, 4096, False)), taken_at=NOW - 1)
    )
    assert fleet.snapshots()[0].slots[0].is_processing
    fleet.end(token)
    assert not fleet.snapshots()[0].slots[0].is_processing


def test_busy_slots_and_the_prefill_backlog_come_from_the_predictions(fleet: Fleet) -> None:
    """A busy slot's wait is its request's predicted rest (never under a floor once overdue); the
    backend's backlog is the predicted prompt processing still ahead."""
    now = NOW
    fleet.begin(Sent("llama", 0, now - 1.0, total_s=5.0, queue_s=0.0, prefill_s=3.0))
    fleet.begin(Sent("llama", 1, now - 10.0, total_s=4.0, queue_s=0.0, prefill_s=2.0))
    fleet.begin(Sent("vllm", None, now - 1.0, total_s=9.0, queue_s=2.0, prefill_s=4.0))
    llama, vllm = fleet.snapshots()
    assert llama.slots[0].busy_s == pytest.approx(4.0, abs=0.1)
    assert llama.slots[1].busy_s == pytest.approx(OVERDUE_FLOOR * 4.0)
    assert llama.prefill_backlog_s == pytest.approx(2.0, abs=0.1)
    assert vllm.prefill_backlog_s == pytest.approx(4.0, abs=0.1)  # still in its predicted queue


def test_requests_deferred_for_a_slot_are_not_in_the_engines_backlog(fleet: Fleet) -> None:
    """A request pinned behind another of turnout's on its slot, or predicted to wait for others'
    work there (``deferred_s``), is not in the engine yet: its prompt is kept apart
    (``deferred_prefill_s``) from the backlog a request sent now to an idle slot waits behind. Once
    the one before it ends, or its predicted deferral is over, it is in the backlog."""
    now = NOW
    running = fleet.begin(Sent("llama", 0, now - 1.0, total_s=5.0, prefill_s=2.0))  # 1 s of 2 done
    fleet.begin(Sent("llama", 0, now - 0.5, total_s=9.0, queue_s=4.0, prefill_s=3.0))  # behind it
    fleet.begin(Sent("llama", 1, now - 0.5, total_s=9.0, queue_s=2.0, deferred_s=2.0, prefill_s=1.5))
    llama = fleet.snapshots()[0]
    assert llama.prefill_backlog_s == pytest.approx(1.0)
    assert llama.deferred_prefill_s == pytest.approx(3.0 + 1.5)
    fleet.end(running)
    llama = fleet.snapshots()[0]
    assert llama.prefill_backlog_s == pytest.approx(3.0)  # its turn on slot 0: in the engine now
    assert llama.deferred_prefill_s == pytest.approx(1.5)
    assert fleet.load()["llama"].backlog_s == pytest.approx(3.0 + 1.5)  # other replicas get both


def test_each_backend_says_how_many_requests_began_there_lately(fleet: Fleet) -> None:
    """``arrivals_per_s``: turnout's requests begun on the backend over the last
    ``ARRIVALS_WINDOW_S``, ended ones too (the cost model prices what a request costs those that
    come next by it)."""
    for started in (NOW - ARRIVALS_WINDOW_S - 1.0, NOW - 10.0, NOW - 1.0):
        fleet.end(fleet.begin(Sent("vllm", None, started, total_s=1.0)))
    fleet.end(fleet.begin(Sent("vllm", None, NOW - 1.0, holds=False)))  # a token count: no arrival
    llama, vllm = fleet.snapshots()
    assert vllm.arrivals_per_s == pytest.approx(2 / ARRIVALS_WINDOW_S)
    assert llama.arrivals_per_s == 0.0


def test_a_warm_ups_prefill_is_its_own_part_of_the_backlog(fleet: Fleet) -> None:
    """``warming_s``: what of the engine's prefill backlog background warm-ups hold (routing warms
    another slot behind them, never beside a client's prompt in progress: ``policies.warm``)."""
    fleet.begin(sent("llama", 0, total_s=5.0, prefill_s=2.0))
    fleet.begin(replace(sent("llama", 1, total_s=3.0, prefill_s=3.0), warm=True))
    llama = by_id(fleet)["llama"]
    assert llama.prefill_backlog_s == pytest.approx(5.0)  # type: ignore[attr-defined]
    assert llama.warming_s == pytest.approx(3.0)  # type: ignore[attr-defined]


def test_a_warm_up_beside_a_prompt_marks_both_ways(fleet: Fleet) -> None:
    """Requests whose prompt processing is predicted to overlap a warm-up's end as ``shared``, the
    warm-up too: the engine's prefill timing of each spans the other's (learning leaves them out).
    Two prompts of clients, or prompts on another engine or that begin after the warm-up's is
    over, are not."""
    early = fleet.begin(sent("llama", 0, total_s=5.0, prefill_s=2.0))
    other = fleet.begin(sent("vllm", None, total_s=5.0, prefill_s=2.0))
    client = fleet.begin(sent("llama", None, total_s=5.0, prefill_s=2.0))
    warm = fleet.begin(replace(sent("llama", 1, total_s=3.0, prefill_s=3.0), warm=True))
    late = fleet.begin(sent("llama", None, total_s=5.0, prefill_s=1.0))
    after = fleet.begin(Sent("llama", None, NOW + 10.0, total_s=5.0, prefill_s=1.0))
    assert fleet.end(early)
    assert fleet.end(late)
    assert fleet.end(warm)
    assert fleet.end(client)
    assert not fleet.end(other)  # another engine
    assert not fleet.end(after)


def test_a_warm_up_sent_after_a_prompt_does_not_overlap_it(fleet: Fleet) -> None:
    """A warm-up waits for the prompts clients wait for (``WarmUp.delay_s``: its ``queue_s``)."""
    client = fleet.begin(sent("llama", 0, total_s=5.0, prefill_s=2.0))
    warm = fleet.begin(replace(sent("llama", 1, total_s=5.0, queue_s=2.0, prefill_s=3.0), warm=True))
    assert not fleet.end(client)
    assert not fleet.end(warm)


def test_requests_queued_on_one_slot_start_when_the_one_before_ends(fleet: Fleet) -> None:
    """llama-server runs the requests pinned to one slot one after the other: a request queued
    behind another has not started, and the time it waited does not count against its own run (a
    burst of one-off requests queued on a slot looked nearly free: each one's total counted down
    from when it was sent)."""
    fleet.begin(Sent("llama", 0, NOW - 1.0, total_s=2.0))  # running, 1 s to go
    fleet.begin(Sent("llama", 0, NOW - 0.9, total_s=2.0))  # then 2 s
    fleet.begin(Sent("llama", 0, NOW - 0.8, total_s=2.0))  # then 2 s
    assert fleet.snapshots()[0].slots[0].busy_s == pytest.approx(5.0)
    fleet.begin(Sent("llama", 1, NOW - 9.0, total_s=2.0))  # overdue: still running
    fleet.begin(Sent("llama", 1, NOW - 8.0, total_s=2.0))  # behind it, from when it ends
    assert fleet.snapshots()[0].slots[1].busy_s == pytest.approx(OVERDUE_FLOOR * 2.0 + 2.0)


def test_a_queued_requests_predicted_wait_is_not_counted_twice(fleet: Fleet) -> None:
    """A request pinned behind another was predicted to wait for it: its predicted total includes
    that wait, which the chain already counts (it starts when the one before ends). Counting both
    made every queue behind a busy slot look longer than it was."""
    fleet.begin(Sent("llama", 0, NOW - 1.0, total_s=3.0))  # running, 2 s to go
    fleet.begin(Sent("llama", 0, NOW, total_s=6.0, queue_s=2.0))  # waits 2 s, then runs 4 s
    assert fleet.snapshots()[0].slots[0].busy_s == pytest.approx(2.0 + 4.0)


def test_another_replicas_load_is_laid_over_the_snapshots(fleet: Fleet) -> None:
    """What one replica publishes (``Fleet.load``) and another lays over its snapshots: the prefill
    backlog adds up; the other replica's slots are left to the probes (its word is up to a second
    old: a slot it just left must not look busy)."""
    now = NOW
    other = Fleet(
        [BackendSpec("llama", EngineKind.LLAMACPP, "http://127.0.0.1:9")],
        httpx.AsyncClient(),
        clock=VirtualClock(NOW, epoch=0.0),
    )
    other.begin(Sent("llama", 1, now - 1.0, total_s=5.0, queue_s=0.0, prefill_s=3.0))
    other.begin(Sent("llama", None, now, total_s=2.0, queue_s=0.0, prefill_s=1.0))
    published = other.load()
    assert published["llama"].running == 2
    fleet.begin(Sent("llama", 0, now, total_s=2.0, queue_s=0.0, prefill_s=0.5))
    fleet.peers = published
    llama = fleet.snapshots()[0]
    assert [s.is_processing for s in llama.slots] == [True, False]
    assert llama.prefill_backlog_s == pytest.approx(0.5 + 2.0 + 1.0, abs=0.1)
    fleet.peers = {}  # the other replica went quiet (its published load expired)
    assert fleet.snapshots()[0].prefill_backlog_s == pytest.approx(0.5, abs=0.1)


def test_loads_add_up() -> None:
    assert Load(1.0, 1) + Load(0.5, 2) == Load(1.5, 3)
    assert Load(1.0, 1, at=NOW - 0.25) + Load(0.5, 2, at=NOW) == Load(0.75 + 0.5, 3, at=NOW)


def test_another_replicas_backlog_is_worked_off_while_its_word_travels(fleet: Fleet) -> None:
    """A replica publishes its prefill backlog twice a second; by the time another routes on it, the
    engine has worked through part of it (a request that finished since must not hold a slot's
    session off its warm slot: two replicas alternating one session)."""
    fleet.peers = {"llama": Load(1.0, 1, at=NOW - 0.4)}
    assert fleet.snapshots()[0].prefill_backlog_s == pytest.approx(0.6)
    fleet.peers = {"llama": Load(1.0, 1, at=NOW - 2.0)}
    assert fleet.snapshots()[0].prefill_backlog_s == 0.0


def test_an_engine_whose_work_counter_went_back_restarted(fleet: Fleet) -> None:
    """A restart between two probes: the counter of tokens processed starts again from zero."""
    llama = fleet.snapshots()[0]
    fleet.observe(replace(llama, work_done=5000.0, taken_at=NOW))
    fleet.observe(replace(llama, work_done=5200.0, taken_at=NOW))
    assert fleet.generations["llama"] == 0
    fleet.observe(replace(llama, work_done=40.0, taken_at=NOW))
    assert fleet.generations == {"llama": 1, "vllm": 0}


def test_an_engine_back_after_being_down_may_have_restarted(fleet: Fleet) -> None:
    llama = fleet.snapshots()[0]
    fleet.report_failure("llama", "connection refused")
    fleet.observe(replace(llama, health=Health.READY, taken_at=NOW))
    assert fleet.generations["llama"] == 1


def test_an_engine_resumed_with_its_slots_restored_is_remembered(fleet: Fleet) -> None:
    """A residency switch that restored a llama-server model's slots (``Fleet.resume``): the new
    process's counters and its time unloaded are no restart; once only. ``forget``: a vLLM sleep
    emptied the cache, as a restart would."""
    llama = fleet.snapshots()[0]
    fleet.observe(replace(llama, work_done=5000.0, taken_at=NOW))
    fleet.report_failure("llama", "llama-q27 is unloaded (llama-server router mode)")
    fleet.resume("llama")
    fleet.observe(replace(llama, health=Health.READY, work_done=12.0, taken_at=NOW))
    assert fleet.generations["llama"] == 0
    fleet.report_failure("llama", "unloaded again, not resumed")
    fleet.observe(replace(llama, health=Health.READY, taken_at=NOW))
    assert fleet.generations["llama"] == 1
    fleet.forget("vllm", "slept")
    assert fleet.generations == {"llama": 1, "vllm": 1}


def test_the_first_probes_are_no_restart() -> None:
    """Unknown, then loading, then ready: an engine starting, not restarting."""
    fleet = Fleet([BackendSpec("llama", EngineKind.LLAMACPP, "http://127.0.0.1:9")], httpx.AsyncClient())
    first = fleet.snapshots()[0]
    for health in (Health.LOADING, Health.READY, Health.READY):
        fleet.observe(replace(first, health=health, taken_at=NOW))
    assert fleet.generations["llama"] == 0


class TestLiveness:
    """What the watchdog asks: is the engine working on something (its own report), or down?"""

    def test_a_probe_after_the_request_that_shows_nothing_running_is_silence(self, fleet: Fleet) -> None:
        assert fleet.liveness("llama", since=NOW - 2) is False  # probed at NOW - 1: after it was sent

    def test_a_probe_taken_before_the_request_cannot_show_it(self, fleet: Fleet) -> None:
        """A busy gateway's probes lag: the last one predates the request, so its idle engine is no
        sign of a hang (a non-streamed answer was cut off as hung while the engine generated it)."""
        assert fleet.liveness("llama", since=NOW) is True
        watchdog = fleet.watchdog("llama")  # sent at NOW, the last probe at NOW - 1
        assert watchdog.liveness() is True

    def test_an_engine_known_down_is_down_whenever_it_was_probed(self, fleet: Fleet) -> None:
        llama = by_id(fleet)["llama"]
        fleet.observe(replace(llama, health=Health.DOWN))  # type: ignore[type-var]
        assert fleet.liveness("llama", since=NOW) is None

    def test_reported_work_keeps_a_request_waiting(self, fleet: Fleet) -> None:
        llama = by_id(fleet)["llama"]
        fleet.observe(replace(llama, queued=1))  # type: ignore[type-var]
        assert fleet.liveness("llama", since=NOW - 2) is True


def test_a_probe_taken_as_the_engine_released_the_slot_does_not_keep_it_busy(fleet: Fleet) -> None:
    """llama-server releases a slot a moment after its last event: a probe taken just after turnout's
    request there ended may still see it processing. That slot is free (a session's next turn left
    its warm slot for the idle one on a busy machine); one seen busy well after is someone else's."""
    token = fleet.begin(Sent("llama", 0, NOW - 5))
    fleet.end(token)  # at NOW
    busy = (SlotState(0, 4096, True), SlotState(1, 4096, False))
    probed = fleet.snapshots()[0]
    fleet.observe(replace(probed, slots=busy, taken_at=NOW + RELEASE_LAG_S / 2))
    assert not fleet.snapshots()[0].slots[0].is_processing
    fleet.observe(replace(probed, slots=busy, taken_at=NOW + RELEASE_LAG_S * 2))
    assert fleet.snapshots()[0].slots[0].is_processing


def test_a_prompt_is_worked_off_over_its_predicted_span(fleet: Fleet) -> None:
    """On vLLM a prompt's chunks share their steps with the running requests' decode steps: 2 s of
    prefill predicted to take 4 s is a quarter done after 1 s, not half (worked off by the prefill
    time alone, the backlog ran out early and the next request was predicted 1-2 s short)."""
    fleet.begin(Sent("vllm", None, NOW - 1.0, total_s=9.0, queue_s=0.0, prefill_s=2.0, interleaved_s=2.0))
    assert fleet.snapshots()[1].prefill_backlog_s == pytest.approx(1.5)
    request = Sent("vllm", None, NOW, queue_s=0.5, prefill_s=2.0, interleaved_s=2.0)
    assert request.prefilled_by == NOW + 4.5


def test_vllm_waiting_requests_leave_out_turnouts_own(fleet: Fleet) -> None:
    """A request waits in vLLM's queue until the next engine step, so a probe often counts one of
    turnout's there; its prompt is in the backlog already, and counted again as waiting it added
    ``service_s / running`` to every queue until the next probe (1.7 s on the chat benchmark, with
    the engine idle). Waiting requests that are not turnout's still count."""
    mine = fleet.begin(Sent("vllm", None, NOW - 1.5, total_s=5.0, prefill_s=3.0))  # before the probe
    probe = fleet.snapshots()[1]
    fleet.observe(replace(probe, running=3, queued=2, taken_at=NOW - 1.0))
    assert fleet.snapshots()[1].queued == 1
    fleet.prefilled(mine)  # past its prompt since the probe: still one the probe may have caught
    assert fleet.snapshots()[1].queued == 1
    fleet.observe(replace(probe, running=3, queued=1, taken_at=NOW - 0.5))
    assert fleet.snapshots()[1].queued == 1  # a newer probe: it was not waiting then


def test_a_streamed_prompt_without_its_first_token_is_still_in_the_backlog(fleet: Fleet) -> None:
    """A streamed prompt's first token says when it is processed: past its predicted span without
    one, the engine is behind the prediction and the prompt still waits (val-mooncake-synthetic:
    150k tokens of prompts without a first token read as a 0-2 s queue, and the next requests were
    sent into it). A prompt not streamed shows nothing until its answer ends: its prediction stands."""
    fleet.begin(Sent("vllm", None, NOW - 10.0, queue_s=0.0, prefill_s=2.0, interleaved_s=1.0, stream=True))
    fleet.begin(Sent("vllm", None, NOW - 9.0, queue_s=3.0, prefill_s=4.0, stream=True))
    fleet.begin(Sent("llama", None, NOW - 10.0, queue_s=0.0, prefill_s=2.0))  # not streamed
    llama, vllm = fleet.snapshots()
    assert llama.prefill_backlog_s == 0.0  # its predicted span is over
    # 7 s of predicted spans, 10 s on the clock: the oldest prompt's floor, in prefill seconds
    assert vllm.prefill_backlog_s == pytest.approx(OVERDUE_FLOOR * 3.0 * 6.0 / 7.0)


def test_the_engine_works_the_backlog_from_the_latest_first_token_it_owed(fleet: Fleet) -> None:
    """The engine processes prompts in the order they came: the first token of the oldest prompt
    starts the clock on the next ones (a prompt predicted done 5 s ago may have waited all that
    time behind the one before it); a later prompt's first token, past one still waiting, does not."""
    old = fleet.begin(Sent("vllm", None, NOW - 10.0, prefill_s=4.0, stream=True))
    fleet.begin(Sent("vllm", None, NOW - 9.0, queue_s=4.0, prefill_s=1.0, stream=True))
    short = fleet.begin(Sent("vllm", None, NOW - 8.0, queue_s=5.0, prefill_s=0.5, stream=True))
    fleet.prefilled(short)  # overtook the two before it: no word on them
    assert fleet.snapshots()[1].prefill_backlog_s == pytest.approx(OVERDUE_FLOOR * 4.0)
    fleet.prefilled(old)  # just now: the next prompt has all of its prefill to go
    assert fleet.snapshots()[1].prefill_backlog_s == pytest.approx(1.0)


def test_a_prompt_that_left_without_a_first_token_says_nothing_of_the_others(fleet: Fleet) -> None:
    """A data plane's fallback answered instead (the Envoy picker): the engine no longer holds that
    prompt, but no first token came from it, so the prompts behind it have not started."""
    old = fleet.begin(Sent("vllm", None, NOW - 10.0, prefill_s=4.0, stream=True))
    fleet.begin(Sent("vllm", None, NOW - 9.0, queue_s=4.0, prefill_s=1.0, stream=True))
    fleet.prefilled(old, seen=False)
    assert fleet.snapshots()[1].prefill_backlog_s == pytest.approx(OVERDUE_FLOOR * 1.0)


def test_vllm_requests_waiting_longer_than_a_step_wait_to_be_admitted(fleet: Fleet) -> None:
    """A probe catches a request of turnout's waiting for the engine's next step only in the moment
    after it was sent; one sent well before the probe and still waiting waits for room in the batch
    (val-burst-70: 179 sequences running, 60 waiting, each wait predicted 3-20 s and 60-110 s long)."""
    fleet.begin(Sent("vllm", None, NOW - 30.0, queue_s=30.0, prefill_s=10.0, stream=True))
    fleet.begin(Sent("vllm", None, NOW - 1.0 - STEP_LAG_S / 2, queue_s=30.0, prefill_s=10.0, stream=True))
    probe = fleet.snapshots()[1]
    fleet.observe(replace(probe, running=179, queued=2, taken_at=NOW - 1.0))
    assert fleet.snapshots()[1].queued == 1


def test_requests_ended_since_the_probe_no_longer_run(fleet: Fleet) -> None:
    """The probe counted turnout's request running; it has ended since: one fewer runs (each
    running request adds to the decode steps a new prompt's chunks share)."""
    token = fleet.begin(Sent("vllm", None, NOW - 5.0, total_s=4.0))
    probe = fleet.snapshots()[1]
    fleet.observe(replace(probe, running=3, taken_at=NOW - 1.0))
    assert fleet.snapshots()[1].running == 3
    fleet.end(token)
    assert fleet.snapshots()[1].running == 2
    fleet.observe(replace(probe, running=2, taken_at=NOW))
    assert fleet.snapshots()[1].running == 2  # the new probe's own count
