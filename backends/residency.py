"""How an engine gives the GPUs back and takes them again: the two steps of a residency switch that
talk to engines (``gateway.residency`` drains, orders and probes around them).

* :class:`VllmSleep`: vLLM's sleep mode (``--enable-sleep-mode``, its endpoints only with
  ``VLLM_SERVER_DEV_MODE=1``). ``free`` is ``POST /sleep?level=N``: level 1 parks the weights in host
  RAM, level 2 drops them; either drops the KV cache, prefix cache included. ``wake`` is ``POST
  /wake_up``; after level 2, the weights are woken, reloaded (``POST /collective_rpc
  {"method": "reload_weights"}``) and then the KV cache (``?tags=``). ``GET /is_sleeping`` says which.
  A sleeping vLLM must get no request: vLLM 0.25 has no answer for one (issue vllm-project/vllm#15483).
* :class:`LlamaRouterModel`: one model of a llama-server in router mode (``--models-max``,
  ``--no-models-autoload``). ``free`` saves its slots (``POST /slots/N?action=save``, needs
  ``--slot-save-path``) and unloads the model (``POST /models/unload``); ``wake`` loads it (``POST
  /models/load``), waits until ``GET /models`` says ``loaded`` and restores the slots that held tokens
  (a restored slot has no checkpoints: its next turn must extend what it held). A load that fails
  (``"failed": true``, an exit code) raises.

Every failure is a :class:`SwitchError` that says which engine, which step and what it answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import msgspec

from backends.clock import WALL, Clock

POLL_S = 0.1
"""How often a load or unload in progress is looked at."""


class SwitchError(Exception):
    """A step of a switch failed: ``backend``, ``step`` (``free``, ``wake``, ...) and why."""

    def __init__(self, backend: str, step: str, message: str) -> None:
        super().__init__(f"{backend}: {step}: {message}")
        self.backend = backend
        self.step = step
        self.message = message


class EngineSwitch(Protocol):
    """One member of a residency set, as a switch drives it."""

    backend_id: str

    async def free(self) -> None:
        """Give the GPUs back (the member has no request in flight)."""

    async def wake(self) -> None:
        """Take the GPUs again; returns once the engine can answer."""

    async def awake(self) -> bool | None:
        """Whether the engine holds its weights now (None: it cannot say)."""

    def keeps(self) -> bool:
        """Whether a free keeps what the engine held, for the next wake to bring back."""

    def restores(self) -> bool:
        """Whether the last wake brought back all that the free before it kept."""


Sleep = Callable[[float], Awaitable[None]]


@dataclass
class _Http:
    backend_id: str
    base_url: str
    client: httpx.AsyncClient
    api_key: str | None = None
    timeout_s: float = 600.0
    """The longest one step may take (a level-2 reload of the weights reads them from disk)."""
    sleep: Sleep = asyncio.sleep
    clock: Clock = WALL
    """What a step's deadline is read on (the gateway's clock)."""

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        return headers | ({"authorization": f"Bearer {self.api_key}"} if self.api_key else {})

    async def call(self, step: str, method: str, path: str, payload: Mapping[str, Any] | None = None) -> Any:
        """One request of ``step``; its JSON answer (None for an empty one). Raises SwitchError."""
        try:
            response = await self.client.request(
                method,
                self.base_url + path,
                content=msgspec.json.encode(payload) if payload is not None else None,
                headers=self._headers(),
                timeout=self.timeout_s,
            )
        except httpx.HTTPError as exc:
            raise SwitchError(self.backend_id, step, f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise SwitchError(
                self.backend_id,
                step,
                f"{method} {path} answered {response.status_code}: {response.text[:300]}",
            )
        if not response.content:
            return None
        try:
            return msgspec.json.decode(response.content)
        except msgspec.DecodeError:
            return response.text


@dataclass
class VllmSleep(_Http):
    """vLLM's sleep mode (module docstring)."""

    level: int = 1

    async def free(self) -> None:
        await self.call("free", "POST", f"/sleep?level={self.level}")

    async def wake(self) -> None:
        if self.level == 1:
            await self.call("wake", "POST", "/wake_up")
            return
        await self.call("wake", "POST", "/wake_up?tags=weights")
        await self.call("wake", "POST", "/collective_rpc", {"method": "reload_weights"})
        await self.call("wake", "POST", "/wake_up?tags=kv_cache")

    def keeps(self) -> bool:
        return False  # any sleep empties vLLM's prefix cache

    def restores(self) -> bool:
        return False

    async def awake(self) -> bool | None:
        answer = await self.call("state", "GET", "/is_sleeping")
        if isinstance(answer, dict) and isinstance(answer.get("is_sleeping"), bool):
            return not answer["is_sleeping"]
        return None


@dataclass
class LlamaRouterModel(_Http):
    """One model of a llama-server in router mode (module docstring)."""

    model: str = ""
    save_slots: bool = False
    saved: list[int] = field(default_factory=list)
    """The slots the last ``free`` saved, restored by the next ``wake``."""
    restored: list[int] = field(default_factory=list)
    """The slots the last ``wake`` restored."""
    lost: list[str] = field(default_factory=list)
    """The slots the last ``wake`` could not restore, and why (the switch goes on without them)."""

    def _file(self, slot: int) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.model)
        return f"turnout-{safe}-slot{slot}.bin"

    async def status(self) -> tuple[str, Mapping[str, Any]]:
        """The model's status in ``GET /models`` (``loaded``, ``loading``, ``unloaded``, ...)."""
        answer = await self.call("state", "GET", "/models")
        entries = answer.get("data") if isinstance(answer, dict) else None
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, dict):
                continue
            if entry.get("id") == self.model or self.model in (entry.get("aliases") or ()):
                status = entry.get("status")
                status = status if isinstance(status, dict) else {}
                return str(status.get("value", "unknown")), status
        raise SwitchError(
            self.backend_id, "state", f"the router lists no model {self.model!r}: {str(answer)[:200]}"
        )

    async def _until(self, step: str, wanted: str) -> None:
        deadline = self.clock.monotonic() + self.timeout_s
        while True:
            value, status = await self.status()
            if value == wanted:
                return
            if status.get("failed"):
                code = status.get("exit_code")
                raise SwitchError(self.backend_id, step, f"{self.model} failed to load (exit code {code})")
            if self.clock.monotonic() > deadline:
                raise SwitchError(
                    self.backend_id, step, f"{self.model} still {value} after {self.timeout_s:g} s"
                )
            await self.sleep(POLL_S)

    async def free(self) -> None:
        self.saved = await self._save_slots() if self.save_slots else []
        await self.call("free", "POST", "/models/unload", {"model": self.model})
        await self._until("free", "unloaded")

    async def _save_slots(self) -> list[int]:
        """Save every slot (one restored and not used since says nothing of what it holds in
        ``/slots``); the ones that held tokens are restored by the next wake."""
        slots = await self.call("free", "GET", f"/slots?model={self.model}")
        saved = []
        for slot in slots if isinstance(slots, list) else ():
            if not isinstance(slot, dict) or not isinstance(slot.get("id"), int):
                raise SwitchError(self.backend_id, "free", f"an odd /slots entry: {str(slot)[:200]}")
            sid = slot["id"]
            body = {"model": self.model, "filename": self._file(sid)}
            answer = await self.call("free", "POST", f"/slots/{sid}?action=save", body)
            if isinstance(answer, dict) and answer.get("n_saved"):
                saved.append(sid)
        return saved

    async def wake(self) -> None:
        await self.call("wake", "POST", "/models/load", {"model": self.model})
        await self._until("wake", "loaded")
        self.restored, self.lost = [], []
        for sid in self.saved:  # each on its own: one bad file costs its slot, not the switch
            body = {"model": self.model, "filename": self._file(sid)}
            try:
                await self.call("wake", "POST", f"/slots/{sid}?action=restore", body)
                self.restored.append(sid)
            except SwitchError as exc:
                self.lost.append(f"slot {sid}: {exc.message}")
        self.saved = []

    def keeps(self) -> bool:
        return self.save_slots

    def restores(self) -> bool:
        return bool(self.restored) and not self.lost

    async def awake(self) -> bool | None:
        value, _ = await self.status()
        return value == "loaded"
