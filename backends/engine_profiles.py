"""Engine profiles on disk: TOML files, read, written and found by name (``policies.engine_profile``).

A config names a profile per backend (``engine_profile = "workstation-vllm-27b-tp2"`` or a path to a
``.toml`` file); a bare name is one of the built-in profiles shipped with turnout
(``backends/profiles/``, which ``deploy/profiles`` links to). Writing keeps the schema's order and
prints the points one per line, so a profile diffs well in review. ``docs/calibrate.md`` documents
the schema.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from policies.engine_profile import (
    EngineProfile,
    ProfileSchemaError,
    profile_from_mapping,
    profile_to_mapping,
)

BUILTIN_DIR = Path(__file__).resolve().parent / "profiles"

_TABLES = ("prefill", "decode", "cache", "machine")
_POINTS = ("prefill_points", "decode_points")


class ProfileNotFound(LookupError):
    """No profile file of that name or path."""


def builtin_names() -> list[str]:
    """The names of the profiles shipped with turnout."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def resolve(ref: str, *, base: Path | None = None) -> Path:
    """The file ``ref`` names: a path (relative to ``base``, a config file's folder) or a bare name."""
    candidate = Path(ref).expanduser()
    if candidate.suffix == ".toml" or os.sep in ref:
        path = candidate if candidate.is_absolute() or base is None else base / candidate
        if path.is_file():
            return path
        raise ProfileNotFound(f"engine profile file {str(path)!r} does not exist")
    path = BUILTIN_DIR / f"{ref}.toml"
    if path.is_file():
        return path
    raise ProfileNotFound(
        f"no engine profile named {ref!r}; built-in: {', '.join(builtin_names())}"
        " (or give the path of a .toml file)"
    )


def load_profile(ref: str | Path, *, base: Path | None = None) -> EngineProfile:
    """Read and validate a profile; ``ref`` a path or a bare name (``resolve``)."""
    path = ref if isinstance(ref, Path) else resolve(ref, base=base)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProfileSchemaError(f"{path}: {exc}") from exc
    try:
        return profile_from_mapping(data)
    except ProfileSchemaError as exc:
        raise ProfileSchemaError(f"{path}: {exc}") from exc


def dump_profile(profile: EngineProfile, *, header: Iterable[str] = ()) -> str:
    """The profile as TOML text (``header`` lines become leading comments)."""
    data = profile_to_mapping(profile)
    lines = [f"# {line}".rstrip() for line in header]
    for key, value in data.items():
        if key in _TABLES or key in _POINTS or key == "checks":
            continue
        lines.append(f"{key} = {_value(value)}")
    for key in _POINTS:
        points = data.get(key) or []
        what = "new, cached, seconds" if key == "prefill_points" else "batch, context, seconds"
        lines.append(f"{key} = [  # {what}")
        lines.extend(f"  [{p[0]}, {p[1]}, {_number(p[2])}]," for p in points)
        lines.append("]")
    for table in _TABLES:
        lines.append("")
        lines.append(f"[{table}]")
        lines.extend(f"{k} = {_value(v)}" for k, v in (data.get(table) or {}).items())
    for check in data.get("checks") or []:
        lines.append("")
        lines.append("[[checks]]")
        lines.extend(f"{k} = {_value(v)}" for k, v in check.items())
    return "\n".join(lines) + "\n"


def save_profile(profile: EngineProfile, path: Path, *, header: Iterable[str] = ()) -> Path:
    """Write ``profile`` to ``path`` atomically and read it back (a profile that does not round-trip
    is a bug here, not a file to leave behind)."""
    text = dump_profile(profile, header=header)
    if profile_from_mapping(tomllib.loads(text)) != profile:
        raise ProfileSchemaError("the profile did not survive its own TOML round trip")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _number(value: float) -> str:
    if not math.isfinite(value):
        raise ProfileSchemaError(f"a profile holds only finite numbers, not {value!r}")
    text = repr(float(value))
    return text if any(c in text for c in ".e") else text + ".0"
