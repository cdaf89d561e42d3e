"""The residency controller's own rules (``gateway.residency``, ``gateway.residency_start``), on stub
engines: a drain that outlasts ``drain_s``, a free or wake that fails (in any way), the rollback, the
start-up check's order and its lock, the members that cannot say yet, and what routing forgets."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from backends.clock import WALL
from backends.residency import SwitchError
from gateway import residency_start
from gateway.residency import Residency
from gateway.residency_state import Phase, SwitchBusy
from gateway.settings_residency import ResidencyConfig
from policies.types import Health


@dataclass
class Engine:
    """A member: whether it holds the cards, and how its steps go (``fail``: step -> exception)."""

    backend_id: str
    up: bool | None = False  # None: it cannot say (still starting)
    fail: dict[str, BaseException] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    kept: bool = False
    restored: bool = False
    falls_asleep_anyway: bool = False  # a free that fails after the engine went to sleep

    async def free(self) -> None:
        self.calls.append(f"free {self.backend_id}")
        if "free" in self.fail:
            if self.falls_asleep_anyway:
                self.up = False
            raise self.fail["free"]
        self.up = False

    async def wake(self) -> None:
        self.calls.append(f"wake {self.backend_id}")
        if "wake" in self.fail:
            raise self.fail["wake"]
        self.up = True

    async def awake(self) -> bool | None:
        if "awake" in self.fail:
            raise self.fail["awake"]
        return self.up

    def keeps(self) -> bool:
        return self.kept

    def restores(self) -> bool:
        return self.restored


@dataclass
class Own:
    requests: int = 0


@dataclass
class Snapshot:
    health: Health


class Fleet:
    """What the controller reads of the fleet: requests in flight, probes, what it forgets."""

    def __init__(self, engines: dict[str, Engine]) -> None:
        self.engines, self.in_flight = engines, {b: Own() for b in engines}
        self.forgotten: list[str] = []
        self.resumed: list[str] = []

    def own(self, backend: str) -> Own:
        return self.in_flight[backend]

    def adapter(self, backend: str) -> Any:
        engine = self.engines[backend]

        class Probe:
            async def probe(self) -> Snapshot:
                return Snapshot(Health.READY if engine.up else Health.DOWN)

        return Probe()

    def observe(self, snapshot: Snapshot) -> None:
        pass

    def forget(self, backend: str, why: str) -> None:
        self.forgotten.append(backend)

    def resume(self, backend: str) -> None:
        self.resumed.append(backend)


def controller(**config: Any) -> tuple[Residency, dict[str, Engine], Fleet]:
    engines = {"a": Engine("a", up=True), "b": Engine("b")}
    members = [{"backend": "a"}, {"backend": "b"}]
    sets = [ResidencyConfig(name="cards", members=members, **{"step_timeout_s": 1, **config})]
    fleet = Fleet(engines)

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(0.001)

    return Residency(sets, engines, fleet, WALL, sleep), engines, fleet  # type: ignore[arg-type]


async def settled(residency: Residency) -> None:
    """Until the set's switch (or start-up check) has ended."""
    state = residency.sets["cards"]
    while state.current is not None:
        await state.changed.wait()


async def switched(residency: Residency, target: str = "b") -> dict[str, Any]:
    residency.start("cards", target, "test")
    await settled(residency)
    view: dict[str, Any] = residency.view()[0]
    return view


def test_a_switch_frees_wakes_probes_and_forgets_what_a_sleep_empties() -> None:
    async def go() -> None:
        residency, engines, fleet = controller()
        view = await switched(residency)
        assert view["awake"] == "b"
        assert view["history"][0]["result"] == "done"
        assert engines["a"].calls == ["free a"]
        assert engines["b"].calls == ["wake b"]
        assert fleet.forgotten == ["a"]  # a vLLM sleep: its prefix cache is gone
        assert residency.asleep() == {"a": "asleep: residency set 'cards' holds b awake"}

    asyncio.run(go())


def test_a_member_that_keeps_its_slots_is_resumed_or_forgotten_by_what_came_back() -> None:
    async def go() -> None:
        residency, engines, fleet = controller()
        engines["a"].kept = engines["b"].kept = True
        engines["b"].restored = True
        await switched(residency)
        assert (fleet.forgotten, fleet.resumed) == ([], ["b"])
        engines["a"].restored = False  # a slot file did not come back
        await switched(residency, "a")
        assert fleet.forgotten == ["a"]

    asyncio.run(go())


def test_a_drain_past_drain_s_calls_the_switch_off_and_frees_nothing() -> None:
    async def go() -> None:
        residency, engines, fleet = controller(drain_s=0.05)
        fleet.in_flight["a"].requests = 1  # a stream that does not end
        view = await switched(residency)
        assert (view["awake"], view["history"][0]["result"]) == ("a", "called-off")
        assert "still had requests in flight after 0.05 s" in view["history"][0]["error"]
        assert engines["a"].calls == []
        assert residency.asleep() == {"b": "asleep: residency set 'cards' holds a awake"}

    asyncio.run(go())


@pytest.mark.parametrize("asleep_anyway", [False, True])
def test_a_failed_free_leaves_or_wakes_the_member_back(asleep_anyway: bool) -> None:
    """A free that fails: a member still awake is left as it is; one that fell asleep anyway (a 28 s
    first sleep past ``step_timeout_s``) is woken again. Either way it keeps the cards."""

    async def go() -> None:
        residency, engines, _ = controller()
        engines["a"].fail["free"] = SwitchError("a", "free", "timed out")
        engines["a"].falls_asleep_anyway = asleep_anyway
        view = await switched(residency)
        assert (view["awake"], view["history"][0]["result"]) == ("a", "failed")
        assert engines["a"].up is True
        assert ("wake a" in engines["a"].calls) is asleep_anyway
        assert engines["b"].calls == []

    asyncio.run(go())


@pytest.mark.parametrize("error", [SwitchError("b", "wake", "exit code 1"), KeyError("id"), TimeoutError()])
def test_a_failed_wake_of_any_kind_is_undone_and_counted(error: BaseException) -> None:
    async def go() -> None:
        residency, engines, _ = controller()
        engines["b"].fail["wake"] = error
        view = await switched(residency)
        assert (view["awake"], view["history"][0]["result"]) == ("a", "failed")
        assert view["counts"] == {"failed": 1}
        assert engines["a"].calls == ["free a", "wake a"]  # freed, then woken again
        assert engines["a"].up is True
        assert residency.sets["cards"].phase is Phase.STEADY

    asyncio.run(go())


def test_one_switch_at_a_time_and_none_to_the_member_awake() -> None:
    async def go() -> None:
        residency, _, fleet = controller(drain_s=5)
        fleet.in_flight["a"].requests = 1
        residency.start("cards", "b", "test")
        with pytest.raises(SwitchBusy):
            residency.start("cards", "a", "test")
        fleet.in_flight["a"].requests = 0
        await settled(residency)
        unchanged = residency.start("cards", "b", "test")
        assert unchanged.result == "unchanged"
        assert residency.view()[0]["counts"] == {"done": 1}  # the no-op is not a switch

    asyncio.run(go())


def test_a_request_waits_for_the_member_being_woken_at_most_wait_s() -> None:
    async def go() -> None:
        residency, engines, _ = controller()
        assert await residency.wait_for(["b"]) is False  # no switch wakes it: no wait
        slow = asyncio.Event()

        async def wake() -> None:
            await slow.wait()
            engines["b"].up = True

        engines["b"].wake = wake  # type: ignore[method-assign]
        residency.start("cards", "b", "test")
        assert await residency.wait_for(["b"], timeout_s=0.05) is False  # wait_s ran out
        slow.set()
        assert await residency.wait_for(["b"], timeout_s=5) is True

    asyncio.run(go())


def test_on_demand_a_request_for_an_asleep_member_wakes_it_and_waits() -> None:
    async def go() -> None:
        residency, engines, _ = controller(on_demand=True, wait_s=5)
        assert residency.can_wake(["b"])  # nothing runs yet, but the set wakes on demand
        assert await residency.wait_for(["b"]) is True
        view = residency.view()[0]
        assert view["awake"] == "b"
        assert view["on_demand"] is True
        assert [(h["from"], h["to"], h["by"], h["result"]) for h in view["history"]] == [
            ("a", "b", "on-demand", "done")
        ]
        assert engines["a"].calls == ["free a"]

    asyncio.run(go())


def test_on_demand_a_request_waits_out_the_switch_running_then_takes_its_turn() -> None:
    """Demand for ``a`` while an admin's switch to ``b`` runs: the request waits for it to end, then
    demand switches back (no refusal, one deadline for both)."""

    async def go() -> None:
        residency, engines, _ = controller(on_demand=True, wait_s=5, min_awake_s=0.05)
        slow = asyncio.Event()
        wake_b = engines["b"].wake

        async def wake() -> None:
            await slow.wait()
            await wake_b()

        engines["b"].wake = wake  # type: ignore[method-assign]
        residency.start("cards", "b", "admin")
        waiting = asyncio.ensure_future(residency.wait_for(["a"]))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # b is being woken: a's request waits, it is not refused
        slow.set()
        assert await waiting is True
        history = [(h["to"], h["by"]) for h in reversed(residency.view()[0]["history"])]
        assert history == [("b", "admin"), ("a", "on-demand")]

    asyncio.run(go())


def test_on_demand_the_member_just_woken_keeps_the_gpus_min_awake_s() -> None:
    """The request a switch woke ``b`` for begins before demand for ``a`` may take the GPUs back: a
    request for ``a`` right after waits out ``min_awake_s`` (it is not refused, and ``b`` is not freed
    under the first one)."""

    async def go() -> None:
        residency, engines, _ = controller(on_demand=True, wait_s=5, min_awake_s=0.3)
        assert await residency.wait_for(["b"]) is True
        loop = asyncio.get_running_loop()
        woke = loop.time()
        assert await residency.wait_for(["a"]) is True
        assert loop.time() - woke >= 0.25  # held for min_awake_s, then switched back
        assert [h["to"] for h in reversed(residency.view()[0]["history"])] == ["b", "a"]
        assert engines["b"].calls == ["wake b", "free b"]

    asyncio.run(go())


def test_on_demand_a_failed_wake_ends_the_wait_at_once_and_is_not_retried_in_a_loop() -> None:
    async def go() -> None:
        residency, engines, _ = controller(on_demand=True, wait_s=5)
        engines["b"].fail["wake"] = SwitchError("b", "wake", "out of memory")
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert await residency.wait_for(["b"]) is False
        assert loop.time() - began < 2  # not the whole wait_s
        view = residency.view()[0]
        assert [h["result"] for h in view["history"]] == ["failed"]  # one try, not a loop
        assert view["awake"] == "a"
        assert not residency.can_wake(["b"])  # the next request is refused at once, for a while
        assert await residency.wait_for(["b"]) is False
        assert len(residency.view()[0]["history"]) == 1

    asyncio.run(go())


def test_on_demand_never_moves_a_model_whose_awake_member_serves_it_but_cannot_now() -> None:
    """The awake member serves the request's model too but is down, drained, circuit-open or was
    excluded after a failure: waking the other member would move the model there for good."""

    async def go() -> None:
        residency, engines, _ = controller(on_demand=True, wait_s=5)
        assert not residency.can_wake(["b"], serving=["a", "b"])
        assert await residency.wait_for(["b"], serving=["a", "b"]) is False
        assert residency.view()[0]["history"] == []
        assert engines["a"].calls == []

    asyncio.run(go())


def test_without_on_demand_a_request_for_an_asleep_member_switches_nothing() -> None:
    async def go() -> None:
        residency, engines, _ = controller(wait_s=5)
        assert not residency.can_wake(["b"])
        assert await residency.wait_for(["b"]) is False
        assert residency.view()[0]["history"] == []
        assert engines["a"].calls == []

    asyncio.run(go())


def test_the_start_check_frees_before_it_wakes_and_locks_the_set() -> None:
    async def go() -> None:
        residency, engines, _ = controller()
        engines["a"].up, engines["b"].up = False, True  # a restart after a switch to b: b holds the cards
        order: list[str] = []
        for engine in engines.values():
            engine.calls = order
        residency_start.check_at_start(residency)
        assert residency.asleep() == {
            "a": "starting: residency set 'cards' checks its engines",
            "b": "starting: residency set 'cards' checks its engines",
        }
        with pytest.raises(SwitchBusy):
            residency.start("cards", "b", "test")
        await settled(residency)
        assert order == ["free b", "wake a"]  # never both on the cards
        view = residency.view()[0]
        assert (view["awake"], view["history"][0]["by"], view["counts"]) == ("a", "start", {})

    asyncio.run(go())


def test_a_member_that_cannot_say_at_start_is_asked_again_and_put_to_sleep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(residency_start, "RETRY_S", 0.01)

    async def go() -> None:
        residency, engines, _ = controller(step_timeout_s=5)
        engines["b"].up = None  # still starting
        residency_start.check_at_start(residency)
        await settled(residency)
        assert residency.asleep() == {"b": "asleep: residency set 'cards' holds a awake"}  # a is routable
        engines["b"].up = True  # it came up awake, beside a
        for _ in range(1000):
            if engines["b"].calls:
                break
            await asyncio.sleep(0.005)
        assert engines["b"].calls == ["free b"]
        assert engines["b"].up is False
        await residency.stop()

    asyncio.run(go())
