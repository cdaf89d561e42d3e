"""What Compose does with a service, done here without docker, so a test can run it as written.

* **Interpolation** (Compose Specification, "Interpolation"): ``${VAR}``, ``$VAR``, ``${VAR:-default}``
  (unset or empty), ``${VAR-default}`` (unset), ``${VAR:?error}`` / ``${VAR?error}``, ``${VAR:+text}`` /
  ``${VAR+text}``, and ``$$`` for a literal ``$``, from the environment (``.env``).
* **The command line**: ``entrypoint`` (or the image's) followed by ``command``; a list is the exec
  form, one argv entry per item, untouched after interpolation; a string is split like a shell.
* **Volumes**: a container path in an argument is the host path the short syntax
  ``HOST:CONTAINER[:MODE]`` mounts there.
* **Healthchecks**: ``["CMD", ...]`` is run as it is, ``["CMD-SHELL", "..."]`` and a string through
  ``/bin/sh -c``; exit status 0 is healthy.

``Substitution`` is the one way a test departs from the file: each names the flag and the value the
file writes, and fails when the file no longer writes it, so a substitution never hides a change.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class InterpolationError(ValueError):
    """A required variable (``${VAR:?message}``) is missing, as ``docker compose`` would refuse it."""


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """``value`` with Compose's variables replaced from ``env``."""

    def one(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("braced") or match.group("bare")
        op, arg = match.group("op"), match.group("arg") or ""
        current = env.get(name)
        present = current is not None and (current != "" or not (op or "").startswith(":"))
        if op in (":-", "-"):
            return current if present and current is not None else arg
        if op in (":?", "?"):
            if not present or current is None:
                raise InterpolationError(f"{name}: {arg or 'required'}")
            return current
        if op in (":+", "+"):
            return arg if present else ""
        return current or ""

    return _VARIABLE.sub(one, value)


def command_line(
    service: Mapping[str, Any], env: Mapping[str, str], *, image_entrypoint: Sequence[str] = ()
) -> list[str]:
    """The argv Compose starts: the service's entrypoint (else the image's), then its command."""
    entrypoint = service.get("entrypoint", list(image_entrypoint))
    return [*_argv(entrypoint, env), *_argv(service.get("command", []), env)]


def _argv(value: str | Sequence[str], env: Mapping[str, str]) -> list[str]:
    if isinstance(value, str):
        return shlex.split(interpolate(value, env))
    return [interpolate(str(item), env) for item in value]


def mount(
    argv: Sequence[str], volumes: Iterable[str], env: Mapping[str, str], *, base: Path = REPO
) -> list[str]:
    """``argv`` with each container path under a bind mount replaced by the host path mounted there."""
    mounts: list[tuple[str, Path]] = []
    for volume in volumes:
        host, container = interpolate(volume, env).split(":")[:2]
        if host.startswith((".", "/", "~")):  # a bind mount, not a named volume
            mounts.append((container.rstrip("/"), (base / Path(host).expanduser()).resolve()))
    out = []
    for arg in argv:
        for container, host in mounts:
            if arg == container or arg.startswith(container + "/"):
                arg = str(host) + arg[len(container) :]
                break
        out.append(arg)
    return out


@dataclass(frozen=True)
class Substitution:
    """``flag written`` in the file becomes ``flag used`` in the test (``used=None`` leaves both out;
    ``written=None`` is a flag without a value)."""

    flag: str
    written: str | None
    used: str | None
    why: str


def substitute(argv: Sequence[str], substitutions: Iterable[Substitution]) -> list[str]:
    """Apply each substitution once; one the command does not contain fails the test."""
    out = list(argv)
    for sub in substitutions:
        width = 1 if sub.written is None else 2
        at = next(
            (i for i in range(len(out) - width + 1)
             if out[i] == sub.flag and (sub.written is None or out[i + 1] == sub.written)),
            None,
        )  # fmt: skip
        if at is None:
            written = sub.flag if sub.written is None else f"{sub.flag} {sub.written}"
            raise AssertionError(
                f"the command no longer contains {written!r}: update its substitution "
                f"(tests/real/test_deploy_commands.py, docs/deploy.md)\n{shlex.join(out)}"
            )
        if sub.used is None:
            del out[at : at + width]
        elif sub.written is None:
            out[at] = sub.used
        else:
            out[at + 1] = sub.used
    return out


def replace_text(text: str, replacements: Mapping[str, str]) -> str:
    """``text`` with each key replaced; a key missing from it fails the test."""
    for written, used in replacements.items():
        assert written in text, f"{written!r} is no longer in the text: update the test's replacement"
        text = text.replace(written, used)
    return text


def healthcheck_argv(test: str | Sequence[str], replacements: Mapping[str, str]) -> list[str]:
    """A healthcheck's ``test`` as the argv Docker runs, with ``replacements`` (e.g. the port)."""
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    kind, *rest = test
    joined = replace_text("\0".join(rest), replacements).split("\0")
    if kind == "CMD":
        return joined
    if kind == "CMD-SHELL":
        return ["/bin/sh", "-c", *joined]
    raise ValueError(f"healthcheck test must start with CMD or CMD-SHELL, not {kind!r}")


def run_healthcheck(
    argv: Sequence[str], *, path: str | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run a healthcheck; ``path`` is the ``PATH`` its tools are found on (the image's, here)."""
    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, env=env)
