"""``InFlight`` keeps its requests per backend (and the prefilling and slotted ones apart) so that a
snapshot's overlay does not look at every request in flight: whatever happens, it lays over exactly
what one look at all of them would (``naive_overlay``, the module docstring's rules)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from backends.inflight import ARRIVALS_WINDOW_S, FORGET_AFTER_S, RELEASE_LAG_S, STEP_LAG_S, InFlight
from backends.sent import Sent, busy_until, seen_left_s
from policies.types import BackendSnapshot, EngineKind, Health, SlotState

BACKENDS = ("llama", "vllm")


def naive_overlay(
    requests: list[Sent],
    ended: dict[tuple[str, int], float],
    snapshot: BackendSnapshot,
    now: float,
    since: Since | None = None,
    begun: list[Sent] | None = None,
    tokens: dict[tuple[str, int], int] | None = None,
    anchor: float = float("-inf"),
) -> BackendSnapshot:
    """``since``: what happened since ``snapshot`` when it is the backend's latest probe; ``begun``:
    every request ever begun (ended ones too: they count in the arrival rate); ``tokens``: the prompt
    tokens of each slot's last ended request; ``anchor``: when the backend's latest first token came
    that no older streamed prompt still waited behind."""
    recent = [
        r for r in begun or [] if r.backend_id == snapshot.backend_id and r.started > now - ARRIVALS_WINDOW_S
    ]
    if recent:
        snapshot = replace(snapshot, arrivals_per_s=len(recent) / ARRIVALS_WINDOW_S)
    mine = [r for r in requests if r.backend_id == snapshot.backend_id]
    # a slot turnout's request left shows free in a probe taken less than RELEASE_LAG_S after that end
    release = snapshot.taken_at - RELEASE_LAG_S
    gone = {s for (b, s), at in ended.items() if b == snapshot.backend_id and at > release}
    since = since or Since()
    # a slot whose request ended after the backend's latest launch: the next launch saves it
    launched = max(
        (r.started for r in begun or [] if r.backend_id == snapshot.backend_id and r.holds), default=-1.0
    )
    held = tokens or {}
    unsaved = {s: held[b, s] for (b, s), at in ended.items() if b == snapshot.backend_id and at > launched}
    if not mine and not gone and not since.ended and not unsaved:
        return snapshot
    busy: dict[int, float] = {}
    for slot in {r.slot for r in mine if r.slot is not None}:
        busy[slot] = busy_until([r for r in mine if r.slot == slot], now) - now
    newer = [r for r in mine if r.started > snapshot.taken_at]
    pinned = {r.slot for r in newer if r.slot is not None}
    freed = gone - set(busy)
    slots = tuple(
        replace(
            s,
            is_processing=(s.is_processing and s.id not in freed) or s.id in pinned,
            busy_s=busy.get(s.id),
            unsaved=unsaved.get(s.id, 0),
        )
        for s in snapshot.slots
    )
    running = max(snapshot.running - since.ended, 0) + len(newer)
    capacity = snapshot.total_slots
    if capacity:
        queued = snapshot.queued + max(0, running - capacity)
        running = min(running, capacity)
    else:  # vLLM: less turnout's requests it may have caught waiting for its next step
        waiting = [
            r
            for r in mine
            if r.prefill_s > 0
            and (r.stream or r.prefilled_by > now)
            and snapshot.taken_at - STEP_LAG_S <= r.started <= snapshot.taken_at
        ]
        queued = max(snapshot.queued - len(waiting) - since.prefilled, 0)
    # prompts without a first token: a streamed one until it comes, another while predicted so; on
    # llama.cpp one behind another of turnout's on its slot, or deferred for the slot, is not in the
    # engine yet (its whole prefill kept apart)
    first: dict[int, Sent] = {}
    for r in mine:
        if r.slot is not None:
            first.setdefault(r.slot, r)
    engine = deferred = 0.0
    watched: list[Sent] = []
    for r in mine:
        if r.prefill_s <= 0 or not (r.stream or r.prefilled_by > now):
            continue
        if (r.slot is not None and first[r.slot] is not r) or r.deferred_at(now):
            deferred += r.prefill_s
        else:
            engine += r.prefill_left_s(now)
            if r.stream:
                watched.append(r)
    # a streamed prompt without its first token still needs what its engine's clock says
    predicted = sum(r.prefill_left_s(now) for r in watched)
    seen = seen_left_s(watched, anchor, now)
    backlog = engine + max(seen - predicted, 0.0)
    return replace(
        snapshot,
        running=running,
        queued=queued,
        slots=slots,
        prefill_backlog_s=backlog,
        deferred_prefill_s=deferred,
    )


@dataclass
class Since:
    """Of the requests sent before a backend's latest probe: how many ended since, and how many of
    those it may have caught waiting for the engine's next step got their first token since."""

    ended: int = 0
    prefilled: int = 0


def snapshot(backend: str, taken_at: float) -> BackendSnapshot:
    if backend == "llama":
        slots = (SlotState(0, 4096, False), SlotState(1, 4096, True))
        return BackendSnapshot(
            backend, EngineKind.LLAMACPP, Health.READY, taken_at, slots=slots, total_slots=2
        )
    return BackendSnapshot(backend, EngineKind.VLLM, Health.READY, taken_at, running=3, queued=2)


Step = tuple[str, str, int | None, float, float, int]
steps = st.lists(
    st.tuples(
        st.sampled_from(["begin", "begin", "prefilled", "end", "probe", "look"]),
        st.sampled_from(BACKENDS),
        st.sampled_from([None, 0, 1]),
        st.floats(0, 5),
        st.floats(0, 2),
        st.integers(0, 30),
    ),
    max_size=40,
)


@given(steps, st.floats(0, 40), st.floats(0, 40))
def test_the_overlay_is_what_one_look_at_every_request_gives(
    script: list[Step], taken_at: float, now: float
) -> None:
    """Whatever was sent, prefilled, ended and probed, in any order, and however often the overlay
    was looked at meanwhile (it forgets requests whose predicted prefill is over)."""
    inflight = InFlight()
    live: dict[int, Sent] = {}
    begun: list[Sent] = []
    ended: dict[tuple[str, int], float] = {}
    held: dict[tuple[str, int], int] = {}
    tokens: list[int] = []
    probed: dict[str, BackendSnapshot] = {}
    since: dict[str, Since] = {}
    anchor: dict[str, float] = {}
    clock = 0.0

    def same(backend: str, at: float) -> None:
        seen = probed.get(backend) or snapshot(backend, taken_at)
        expected = naive_overlay(
            list(live.values()),
            ended,
            seen,
            at,
            since.get(backend),
            begun,
            held,
            anchor.get(backend, float("-inf")),
        )
        got = inflight.overlay(seen, at)
        assert (got.running, got.queued, got.prefill_backlog_s) == (
            expected.running,
            expected.queued,
            expected.prefill_backlog_s,
        )
        assert got == expected

    def caught_waiting(request: Sent) -> bool:  # by the backend's probe, for the engine's next step
        probe = probed.get(request.backend_id)
        return probe is not None and probe.taken_at - STEP_LAG_S <= request.started <= probe.taken_at

    def before_probe(request: Sent) -> bool:
        return request.backend_id in probed and request.started <= probed[request.backend_id].taken_at

    for kind, backend, slot, total, prefill, pick in script:
        clock += 1.0
        if kind == "begin":
            pinned = slot if backend == "llama" else None  # llama.cpp: deferred for a busy slot a while
            deferred = prefill / 2 if backend == "llama" else 0.0
            stream = pick % 2 == 0  # its first token seen when it comes
            request = Sent(
                backend, pinned, clock, total, 0.5, deferred, prefill, interleaved_s=pick / 10, stream=stream
            )
            token = inflight.begin(request)
            live[token] = request
            begun.append(request)
            tokens.append(token)
        elif kind == "probe":  # taken a little before now: requests sent since it count as newer
            probed[backend] = snapshot(backend, clock - total)
            since[backend] = Since()
            inflight.seen(probed[backend])
        elif kind == "look":
            same(backend, clock)
        elif tokens:
            token = tokens[pick % len(tokens)]
            if kind == "prefilled" and token in live:
                inflight.prefilled(token, clock)
                request = live[token]
                older = [
                    t
                    for t, r in live.items()
                    if t < token and r.backend_id == request.backend_id and r.stream
                ]
                if request.stream and request.prefill_s > 0 and not any(live[t].prefill_s > 0 for t in older):
                    anchor[request.backend_id] = clock
                if request.prefill_s > 0 and caught_waiting(request):
                    since[request.backend_id].prefilled += 1
                live[token] = replace(request, prefill_s=0.0)
            elif kind == "end" and inflight.end(token, clock) is not None:
                request = live.pop(token)
                if before_probe(request):
                    since[request.backend_id].ended += 1
                if request.slot is not None:
                    ended[(request.backend_id, request.slot)] = clock
                    held[(request.backend_id, request.slot)] = max(request.prompt_tokens, 1)
    now = max(now, clock)  # the clock does not go back
    for backend in BACKENDS:
        same(backend, now)
    load = inflight.load(now)
    for backend in BACKENDS:
        mine = [r for r in live.values() if r.backend_id == backend]
        if mine:
            assert load[backend].running == len(mine)
            expected = naive_overlay(
                list(live.values()),
                {},
                snapshot(backend, now),
                now,
                anchor=anchor.get(backend, float("-inf")),
            )
            backlog = expected.prefill_backlog_s + expected.deferred_prefill_s
            assert abs(load[backend].backlog_s - backlog) < 1e-9


def test_a_request_never_ended_is_forgotten_after_an_hour_of_probes() -> None:
    """A request lost without ``end`` (a bug, a crash mid-relay) stops counting once a probe is
    ``FORGET_AFTER_S`` younger than it; the ones sent later still count."""
    inflight = InFlight()
    inflight.begin(Sent("vllm", None, 0.0, 1.0, 0.0, 5.0))
    inflight.begin(Sent("vllm", None, 100.0, 1.0, 0.0, 5.0))
    inflight.seen(snapshot("vllm", FORGET_AFTER_S + 50.0))
    assert inflight.load(FORGET_AFTER_S + 50.0)["vllm"].running == 1
    inflight.seen(snapshot("vllm", FORGET_AFTER_S + 150.0))
    assert not inflight
