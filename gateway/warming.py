"""Background warm-ups of llama.cpp slots (``policies.warm``): while a request is served where it is
fast, its prompt, capped at one output token, is prefilled into the llama.cpp slot the decision
named, so the session's next turn finds it there.

A warm-up is a request of turnout's own. It is in flight on the fleet like any other (requests
routed meanwhile see the slot busy and the engine's prefill backlog); it is sent after the prompts
clients wait for on that engine (``WarmUp.delay_s``: sharing their batches would slow them); the
prefix index records the prompt in the slot as it is sent (:func:`warmed`: the session's next turn
may come before it ends). It teaches only the engine's prefill rate, and only where no client's
prompt ran beside it (``Router.absorb_prefill``: its answer is one token, no client waited for
it); it has no decision log entry of its own (the decision that asked for it says so,
``warm_up``); a failure costs nothing but the warm slot: it is logged and dropped.

The relay and the Envoy picker run their warm-ups as tasks of :class:`Warming` (ended with the
gateway); the virtual replay dispatches the same request to its engine model
(``gateway.replay.virtual``), with the same in-flight note (:func:`warm_sent`), index record and
learning (:func:`learn_from`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any

import structlog

from backends.base import UpstreamRequest
from backends.errors import UpstreamError
from backends.fleet import Fleet
from backends.sent import Sent
from backends.stream import ResponseRelay
from gateway.routed import Routed
from gateway.routing import Router
from gateway.state import SentPrompt
from policies import Endpoint
from policies.checkpoints import DEFAULT_GAP
from policies.decision import Outcome, WarmUp
from policies.features import OUTPUT_LIMIT_FIELDS
from policies.slot_rules import checkpoint_gap
from policies.types import Deployment, EngineKind, Usage

log = structlog.get_logger(__name__)

WARM_OUTPUT_TOKENS = 1
"""What a warm-up may generate: one token (llama-server processes the whole prompt for it)."""


def warm_body(body: Mapping[str, Any], endpoint: Endpoint) -> dict[str, Any]:
    """The client's request as a warm-up: not streamed, its output capped at one token."""
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    fields = OUTPUT_LIMIT_FIELDS.get(endpoint, ("max_tokens",))
    for field in fields[1:]:
        out.pop(field, None)
    out[fields[0]] = WARM_OUTPUT_TOKENS
    return out


def warm_sent(warm: WarmUp, routed: Routed, now: float) -> Sent:
    """The fleet's note of the warm-up in flight: the slot busy, its prefill in the engine's backlog."""
    return Sent(
        warm.backend_id,
        warm.slot,
        now,
        total_s=warm.ready_s,
        queue_s=max(warm.ready_s - warm.prefill_s, warm.delay_s),
        prefill_s=warm.prefill_s,
        prompt_tokens=routed.features.prompt_tokens,
        warm=True,
    )


def warmed(warm: WarmUp, routed: Routed) -> SentPrompt | None:
    """The prefix index record of a warm-up, written as it is sent: the session's next turn may come
    before it ends, and must find the slot busy with its own prompt, not cold (None: no chain)."""
    chain = routed.features.chain
    if not chain.length:
        return None
    key = routed.session.key if routed.session is not None else None
    features = routed.features
    tokens, user, first = features.prompt_tokens, features.user_start, features.first_user_start
    there = warm_deployment(routed, warm)
    gap = checkpoint_gap(there) if there is not None else DEFAULT_GAP
    return SentPrompt(
        warm.backend_id, warm.slot, chain, tokens, key, user_start=user, gap=gap, first_user=first,
        head=features.head,
    )  # fmt: skip


def learn_from(router: Router, warm: WarmUp, routed: Routed, usage: Usage | None, *, shared: bool) -> None:
    """What a finished warm-up teaches the router: the engine's prefill rate from its own timings
    (``Router.absorb_prefill``); nothing where a client's prompt ran beside it (``shared``)."""
    deployment = warm_deployment(routed, warm)
    if usage is None or shared or deployment is None:
        return
    outcome = Outcome(
        warm.backend_id, deployment.model, EngineKind.LLAMACPP, usage, None, 0.0, 0, 0, stream=False
    )
    router.absorb_prefill(outcome, deployment)


def warm_deployment(routed: Routed, warm: WarmUp) -> Deployment | None:
    """The warmed backend's deployment among the decision's candidates."""
    for candidate in routed.decision.candidates:
        if candidate.deployment.backend_id == warm.backend_id:
            return candidate.deployment
    return None


class Warming:
    """The relay's warm-ups in flight: one task each, cancelled by :meth:`close`."""

    def __init__(self, fleet: Fleet, router: Router) -> None:
        self.fleet = fleet
        self.router = router
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, endpoint: Endpoint, body: Mapping[str, Any], routed: Routed) -> None:
        """Send ``routed``'s warm-up, if it has one, in the background."""
        warm = routed.warm
        deployment = warm_deployment(routed, warm) if warm is not None else None
        if warm is None or deployment is None:
            return
        adapter = self.fleet.adapter(warm.backend_id)
        upstream = adapter.prepare(
            endpoint, warm_body(body, endpoint), deployment, body["model"], slot=warm.slot
        )
        token = self.fleet.begin(warm_sent(warm, routed, self.fleet.clock.time()))
        task = asyncio.create_task(self._run(upstream, token, warm, routed))
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._done, token))

    def _done(self, token: int, task: asyncio.Task[None]) -> None:
        """The task ended, however: off the fleet (a task cancelled before it ran never reached
        ``_run``'s own ``finally``; ``Fleet.end`` of an ended request is nothing)."""
        self._tasks.discard(task)
        self.fleet.end(token)

    async def _run(self, upstream: UpstreamRequest, token: int, warm: WarmUp, routed: Routed) -> None:
        adapter = self.fleet.adapter(warm.backend_id)
        relay: ResponseRelay | None = None
        try:
            sent = warmed(warm, routed)
            if sent is not None:
                await self.router.store.record_prompt(sent)
            if warm.delay_s > 0:  # the prompts clients wait for there go first
                await asyncio.sleep(warm.delay_s)
            relay = ResponseRelay(upstream, await adapter.send(upstream), self.fleet.clock.monotonic)
            await relay.body()
            learn_from(self.router, warm, routed, relay.usage, shared=self.fleet.end(token))
            log.debug("warm_up.done", backend=warm.backend_id, slot=warm.slot)
        except UpstreamError as exc:
            log.warning("warm_up.failed", backend=warm.backend_id, slot=warm.slot, error=exc.message)
        except Exception as exc:  # a task of its own: nothing else would see it, and nothing waits on it
            log.warning("warm_up.failed", backend=warm.backend_id, slot=warm.slot, error=repr(exc))
        finally:
            if relay is not None:
                await relay.aclose()

    @property
    def running(self) -> int:
        """Warm-ups in flight."""
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel the warm-ups still running (the gateway is stopping)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
