"""What if: the recording's last minutes replayed in virtual time under every profile, on this
gateway's fleet or an edited one, by ``turnout replay`` itself (docs/dashboard.md, "What if").

:func:`fleet` writes this gateway's routing config as a turnout config: its backends, models, groups,
profiles and state settings (no API keys, no admin token, no Redis URL), with each llama.cpp
backend's slots and each deployment's window as the engines last reported them, then the operator's
edits: remove a backend, add a copy of one, set a backend's slots or its deployments' windows.
:class:`WhatIf` writes it, and the recording's last N minutes (what ``turnout replay --last-minutes N``
takes: the recording goes on, the window must not), into ``<recording>.whatif/`` and runs::

    turnout replay WINDOW --model M --backends FLEET --profile P ... --json REPORT

in a child process (the replay is CPU-bound: the gateway keeps serving meanwhile), one at a time,
within :data:`TIMEOUT_S`. The page shows that command: run by hand, it prints the same numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from gateway.api.service import WhatIfEdits as Edits
from gateway.replay.traces import TraceError, TraceRequest, last_minutes, read_trace, write_trace
from gateway.settings import ConfigError, Settings, load_settings, served_models
from policies.types import BackendSnapshot, EngineKind

TIMEOUT_S = 120.0
"""A replay that takes longer is stopped (a day of heavy traffic on a slow machine)."""
MAX_MINUTES = 24 * 60
MAX_SLOTS = 64
MIN_WINDOW, MAX_WINDOW = 256, 10_000_000
COPY_SUFFIX = "-copy"


class WhatIfError(ValueError):
    """A what-if that cannot run as asked; the message says why (a 400, or 409 while one runs)."""


class Busy(WhatIfError):
    """Another what-if is running."""


def fleet(settings: Settings, snapshots: Sequence[BackendSnapshot], edits: Edits) -> dict[str, Any]:
    """This gateway's routing config as a turnout config's data, edited (module docstring)."""
    _check(settings, edits)
    seen = {s.backend_id: s for s in snapshots}
    backends: list[dict[str, Any]] = [
        _backend(b.model_dump(mode="json", exclude_none=True), seen.get(b.id)) for b in settings.backends
    ]
    models: list[dict[str, Any]] = [m.model_dump(mode="json", exclude_none=True) for m in settings.models]
    deployments = [d for m in models for d in m["deployments"]]
    for deployment in deployments:
        reported = _reported_window(seen.get(deployment["backend"]), deployment["upstream_name"])
        if reported:
            deployment["context_window"] = reported
    for original in edits.copies:  # a copy is the original as the engines reported it
        copy = _copy_id(original, {b["id"] for b in backends})
        backends.append({**next(b for b in backends if b["id"] == original), "id": copy})
        for model in models:
            ours = [d for d in model["deployments"] if d["backend"] == original]
            model["deployments"] += [{**d, "backend": copy} for d in ours]
    for backend in backends:
        if backend["id"] in edits.slots:
            backend["sim"] = {**backend.get("sim", {}), "slots": edits.slots[backend["id"]]}
    for model in models:
        for deployment in model["deployments"]:
            if deployment["backend"] in edits.windows:
                deployment["context_window"] = edits.windows[deployment["backend"]]
    gone = set(edits.remove)
    backends = [b for b in backends if b["id"] not in gone]
    for model in models:
        model["deployments"] = [d for d in model["deployments"] if d["backend"] not in gone]
    models = [m for m in models if m["deployments"]]
    return {
        "state": settings.state.model_dump(mode="json", exclude_none=True, exclude={"url"}),
        "profiles": [p.model_dump(mode="json", exclude_none=True) for p in settings.profiles],
        "backends": backends,
        "models": models,
        "groups": _groups(settings, {m["name"] for m in models}),
    }


def _check(settings: Settings, edits: Edits) -> None:
    known = {b.id: b for b in settings.backends}
    for backend in [*edits.remove, *edits.copies, *edits.slots, *edits.windows]:
        if backend not in known:
            raise WhatIfError(f"no backend {backend!r}; backends: {', '.join(known)}")
    if not set(known) - set(edits.remove) and not edits.copies:
        raise WhatIfError("removing every backend leaves nothing to replay on")
    for backend, slots in edits.slots.items():
        if known[backend].kind is not EngineKind.LLAMACPP:
            raise WhatIfError(f"{backend!r} is not a llama.cpp backend: it has no slots to set")
        if not 1 <= slots <= MAX_SLOTS:
            raise WhatIfError(f"slots of {backend!r}: 1 to {MAX_SLOTS}, not {slots}")
    for backend, tokens in edits.windows.items():
        if not MIN_WINDOW <= tokens <= MAX_WINDOW:
            raise WhatIfError(f"window of {backend!r}: {MIN_WINDOW:,} to {MAX_WINDOW:,} tokens, not {tokens}")


def _reported_window(snapshot: BackendSnapshot | None, upstream: str) -> int | None:
    """The window the engine reported for ``upstream`` (None before it was probed)."""
    if snapshot is None:
        return None
    return next((d.context_window for d in snapshot.deployments if d.upstream_name == upstream), None)


def _groups(settings: Settings, models: set[str]) -> list[dict[str, Any]]:
    """The groups that keep two members or more among ``models``."""
    groups = []
    for group in settings.groups:
        data = group.model_dump(mode="json", exclude_none=True)
        data["members"] = [m for m in data["members"] if m in models]
        if data.get("default") not in (None, *data["members"]):
            del data["default"]
        if len(data["members"]) >= 2:
            groups.append(data)
    return groups


def _backend(data: dict[str, Any], reported: BackendSnapshot | None) -> dict[str, Any]:
    data.pop("api_key", None)
    profile = data.get("engine_profile")
    if profile is not None and Path(profile).exists():  # a file: found from wherever the replay runs
        data["engine_profile"] = str(Path(profile).resolve())
    if reported is not None and reported.total_slots and not data.get("sim", {}).get("slots"):
        data.setdefault("sim", {})["slots"] = reported.total_slots
    return data


def _copy_id(original: str, taken: set[str]) -> str:
    name, n = f"{original}{COPY_SUFFIX}", 1
    while name in taken:
        n += 1
        name = f"{original}{COPY_SUFFIX}{n}"
    return name


def window(recording: Path, minutes: int) -> list[TraceRequest]:
    """The recording's last ``minutes`` (what ``--last-minutes`` replays)."""
    try:
        return last_minutes(read_trace(recording, "turnout"), minutes)
    except FileNotFoundError as exc:
        raise WhatIfError(f"nothing recorded yet at {recording}") from exc
    except (OSError, TraceError) as exc:
        raise WhatIfError(f"{recording}: {exc}") from exc


def command(trace: Path, model: str, fleet_file: Path, report: Path, profiles: Sequence[str]) -> list[str]:
    """The ``turnout replay`` arguments the page runs (and shows)."""
    argv = ["turnout", "replay", str(trace), "--model", model, "--backends", str(fleet_file)]
    for profile in profiles:
        argv += ["--profile", profile]
    return [*argv, "--json", str(report)]


class WhatIf:
    """Runs what-ifs one at a time, for one recording."""

    def __init__(self, recording: Path) -> None:
        self.recording = recording
        self.folder = recording.with_name(recording.name + ".whatif")
        self._running = asyncio.Lock()

    async def run(self, config: dict[str, Any], edits: Edits, profiles: Sequence[str]) -> dict[str, Any]:
        """Write the fleet, run the replay, and return its report with the command that made it."""
        if not 1 <= edits.minutes <= MAX_MINUTES:
            raise WhatIfError(f"minutes: 1 to {MAX_MINUTES}, not {edits.minutes}")
        if self._running.locked():
            raise Busy("a what-if is running; try again when it has finished")
        async with self._running:
            requests = await asyncio.to_thread(window, self.recording, edits.minutes)
            if not requests:
                raise WhatIfError(f"nothing recorded in the last {edits.minutes} minutes of {self.recording}")
            model = edits.model or Counter(r.model for r in requests).most_common(1)[0][0]
            try:  # the fleet must load, and serve the model, as the replay will read it
                served_models(load_settings(None, **config), model)
            except ConfigError as exc:
                raise WhatIfError(str(exc)) from exc
            self.folder.mkdir(parents=True, exist_ok=True)
            trace, fleet_file, report = (
                self.folder / name for name in ("window.jsonl", "fleet.toml", "report.json")
            )
            with trace.open("w", encoding="utf-8") as handle:  # the recording goes on: the window stays
                write_trace(requests, handle)
            fleet_file.write_text(tomli_w.dumps(config), encoding="utf-8")
            report.unlink(missing_ok=True)
            argv = command(trace, model, fleet_file, report, profiles)
            output = await _replay(argv)
            try:
                result: dict[str, Any] = json.loads(report.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise WhatIfError(f"turnout replay failed: {output[-2000:] or exc}") from exc
            counts = Counter(r.model for r in requests)
            summary = {
                "command": shlex.join(argv),
                "model": model,
                "minutes": edits.minutes,
                "requests": counts[model],  # a replay runs one model's engines: its requests
                "recorded": len(requests),
                "other_models": {m: n for m, n in counts.most_common() if m != model},
            }
            return {**summary, **result}


async def _replay(argv: list[str]) -> str:
    """Run ``turnout replay`` (``argv[2:]``) in a child process; its output (stderr: progress)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", *argv[1:],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    except TimeoutError as exc:
        raise WhatIfError(f"the replay took longer than {TIMEOUT_S:.0f} s; ask for fewer minutes") from exc
    finally:  # timed out, or the admin's request went away (cancelled): the replay stops too
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return out.decode(errors="replace")
