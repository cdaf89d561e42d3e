"""llama-server adapter: prompt caching on, slots and load from /props, /slots and /metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import quote

import msgspec
from msgspec.structs import replace

from backends.anthropic_chat import to_chat
from backends.base import UPSTREAM_PATHS, Adapter, UpstreamRequest
from backends.errors import UpstreamStatusError
from backends.parsers.llamacpp import parse_metrics, parse_props, parse_slots
from backends.slot_watch import CLEARED_IDLE_SLOTS, cleared_while_idle
from policies.features import within_window
from policies.types import BackendSnapshot, Deployment, Endpoint, EngineKind, Health, SlotState

ROUTER_MODEL_PATHS = ("/props", "/slots", "/metrics")
"""What a llama-server router answers per model: the probes name theirs (``BackendSpec.router_model``)."""


class LlamaCppAdapter(Adapter):
    """llama.cpp's ``llama-server``.

    Its streams always end with ``timings`` (and ``usage`` on ``/v1/completions``), so no usage
    request is added; ``cache_prompt`` is set to true unless the client chose otherwise, and the
    session's slot is pinned with ``id_slot``.
    """

    kind: ClassVar[EngineKind] = EngineKind.LLAMACPP

    def rewrite_body(
        self, endpoint: Endpoint, body: dict[str, Any], deployment: Deployment, slot: int | None
    ) -> bool:
        if endpoint is Endpoint.COUNT_TOKENS:
            return False
        body.setdefault("cache_prompt", True)
        if slot is not None:
            body.setdefault("id_slot", slot)  # a client's own id_slot wins
        return False

    async def count_tokens(
        self, endpoint: Endpoint, body: Mapping[str, Any], deployment: Deployment
    ) -> int | None:
        """Chat: ``POST /v1/chat/completions/input_tokens``; text: ``POST /tokenize``."""
        if endpoint is Endpoint.CHAT:
            payload = {k: v for k, v in body.items() if k in ("messages", "tools", "tool_choice")}
            data = await self._post_json("/v1/chat/completions/input_tokens", payload)
            count = data.get("input_tokens") if isinstance(data, dict) else None
            return count if isinstance(count, int) else None
        if not isinstance(body.get("prompt"), str):
            return None
        data = await self._post_json("/tokenize", {"content": body["prompt"], "add_special": True})
        tokens = data.get("tokens") if isinstance(data, dict) else None
        return len(tokens) if isinstance(tokens, list) else None

    def prepare(
        self,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        deployment: Deployment,
        client_model: str,
        slot: int | None = None,
    ) -> UpstreamRequest:
        """As for every engine, except a pinned Anthropic request: llama-server's ``/v1/messages``
        ignores ``id_slot``, so it goes to ``/v1/chat/completions`` and its answer is translated back
        (``backends.anthropic_chat``)."""
        if endpoint is not Endpoint.MESSAGES or slot is None:
            return super().prepare(endpoint, body, deployment, client_model, slot)
        chat = to_chat({**body, **within_window(body, endpoint, deployment.context_window)})
        chat["model"] = deployment.upstream_name
        chat["cache_prompt"] = body.get("cache_prompt", True)
        chat["id_slot"] = body.get("id_slot", slot)
        return UpstreamRequest(
            backend_id=self.spec.id,
            url=self.spec.base_url + UPSTREAM_PATHS[Endpoint.CHAT],
            body=msgspec.json.encode(chat),
            stream=bool(chat.get("stream", False)),
            headers=(("content-type", "application/json"), *self._auth),
            anthropic_from_chat=client_model,
        )

    def health_for_status(self, error: UpstreamStatusError) -> Health:
        if error.status == 503 and error.message == "Loading model":
            return Health.LOADING
        return Health.DOWN

    seen_slots: tuple[SlotState, ...] = ()
    """The slots as the previous probe saw them."""
    cleared_slots: int = 0
    """Idle slots seen cleared by the server so far (``backends.slot_watch``)."""

    async def _get(self, path: str) -> tuple[int, Any]:
        """As for every engine; in router mode the per-model probes name the model (``?model=``)."""
        model = self.spec.router_model
        if model is not None and path.split("?")[0] in ROUTER_MODEL_PATHS:
            path += ("&" if "?" in path else "?") + "model=" + quote(model, safe="")
        return await super()._get(path)

    async def _post_json(self, path: str, payload: Mapping[str, Any]) -> Any:
        """As for every engine; a router routes a POST by its body's ``model``."""
        model = self.spec.router_model
        return await super()._post_json(path, payload if model is None else {**payload, "model": model})

    async def router_status(self) -> str | None:
        """In router mode, the model's status in ``GET /models`` (``loaded``, ``unloaded``, ...);
        None otherwise, or when the router does not list it."""
        model = self.spec.router_model
        if model is None:
            return None
        status, data = await self._get("/models")
        for entry in data.get("data", ()) if status < 400 and isinstance(data, dict) else ():
            if entry.get("id") == model or model in (entry.get("aliases") or ()):
                return str((entry.get("status") or {}).get("value", "unknown"))
        return None

    async def probe_engine(self, base: BackendSnapshot) -> BackendSnapshot:
        if self.spec.router_model is not None:
            state = await self.router_status()
            if state != "loaded":
                error = f"{self.spec.router_model} is {state or 'not listed'} (llama-server router mode)"
                return replace(base, health=Health.DOWN, error=error)
        props = parse_props(await self._get_ok("/props"))
        slots = await self._probe_slots()
        self.cleared_slots += len(cleared_while_idle(self.seen_slots, slots))
        self.seen_slots = slots
        status, text = await self._get("/metrics")
        work_done = None
        if status < 400:  # /metrics needs --metrics; without it, busy slots are all we know
            metrics = parse_metrics(str(text))
            running, queued, work_done = metrics.processing, metrics.deferred, metrics.decode_calls
        else:
            running, queued = sum(1 for s in slots if s.is_processing), 0
        deployments = base.deployments
        if props.n_ctx:
            deployments = tuple(
                replace(d, context_window=min(d.context_window or props.n_ctx, props.n_ctx))
                for d in deployments
            )
        return replace(
            base,
            deployments=deployments,
            running=running,
            queued=queued,
            slots=slots,
            total_slots=props.total_slots,
            work_done=work_done,
            warnings=(CLEARED_IDLE_SLOTS,) if self.cleared_slots else (),
        )

    async def _probe_slots(self) -> tuple[SlotState, ...]:
        status, data = await self._get("/slots")
        return parse_slots(data) if status < 400 else ()

    async def slot_test(self) -> bool | None:
        """Whether a slot keeps its cache while another slot works: a few tokens on slot 0, then on
        slot 1, then ``/slots`` (``backends.slot_watch``). None when it cannot tell: fewer than two
        slots, or a slot busy (the test waits for none). It replaces what slots 0 and 1 held."""
        slots = await self._probe_slots()
        if len(slots) < 2 or any(slot.is_processing for slot in slots):
            return None
        for slot, words in ((0, "turnout slot test one two three four"), (1, "turnout slot test five six")):
            body = {"prompt": words, "max_tokens": 1, "id_slot": slot, "cache_prompt": True}
            await self._post_json("/v1/completions", body)
        after = {slot.id: slot for slot in await self._probe_slots()}
        return after[0].tokens != 0 if 0 in after and after[0].tokens is not None else None
