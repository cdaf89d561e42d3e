"""The chaos soak (issue #14): agents stream through turnout while an engine is killed and restarted.

    .venv/bin/python bench/chaos.py [--minutes 10] [--agents 4] [--kill-every 60 120] [--seed 0]

Starts a vLLM and a llama.cpp simulator as processes (``turnout sim``, loopback) and turnout in this
process (a server thread), then runs ``--agents`` agents: each sends streamed turns of a growing
conversation (with its session id) one after the other, a short think time between. Every
``--kill-every`` seconds (uniform in the range) one engine, in turn, is killed with SIGKILL and
started again on its port. At the end it prints, and checks:

- every request either completed (``[DONE]`` after its content, once) or ended with a clear error
  (an error event, or an error status with the API's error JSON); none hung (a client timeout of
  ``HANG_S``), none was answered twice;
- the errors match the faults: every failed request was on an engine killed while it ran (or sent
  while that engine was down and nothing else could take it);
- nothing leaked: no request in flight and no slot lease of a dead session left in the gateway.

Bounded in time (``--minutes``) and count (the agents' turns), loopback only.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: tests/ is importable
from gateway.app import create_app
from gateway.logging import configure_logging
from tests.e2e.conftest import stack_settings
from tests.e2e.processes import SimProcess
from tests.servers import ServerThread

HANG_S = 120.0
SYSTEM = "You are a careful coding agent working in a large repository. " * 60


@dataclass
class Outcome:
    agent: int
    started: float
    ended: float
    backend: str | None
    status: int
    kind: str  # completed | error-event | error-status | hung | malformed
    detail: str = ""


@dataclass
class Kill:
    backend: str
    at: float
    back_at: float = 0.0


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)


def one_turn(url: str, agent: int, history: list[dict[str, str]], rng: random.Random) -> Outcome:
    history.append({"role": "user", "content": f"step {len(history)}: " + "look at the failing test " * 40})
    body = {"model": "m-both", "messages": history, "stream": True, "max_tokens": rng.randint(100, 1500)}
    started = time.monotonic()
    try:
        with httpx.stream(
            "POST", url + "/v1/chat/completions", json=body, timeout=HANG_S,
            headers={"x-session-id": f"chaos-agent-{agent}"},
        ) as response:  # fmt: skip
            backend = response.headers.get("x-turnout-backend")
            if response.status_code != 200:
                raw = response.read()
                error = json.loads(raw).get("error", {}) if raw.startswith(b"{") else {}
                kind = "error-status" if error.get("message") else "malformed"
                return Outcome(
                    agent, started, time.monotonic(), backend, response.status_code, kind, str(error)
                )
            data = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
    except httpx.TimeoutException:
        return Outcome(agent, started, time.monotonic(), None, 0, "hung")
    ended = time.monotonic()
    if data.count("[DONE]") != 1 or data[-1] != "[DONE]":
        return Outcome(agent, started, ended, backend, 200, "malformed", f"{data.count('[DONE]')} x [DONE]")
    errors = [d for d in data if d.startswith('{"error"')]
    if errors:
        return Outcome(agent, started, ended, backend, 200, "error-event", errors[0][:200])
    text = "".join(
        json.loads(d)["choices"][0]["delta"].get("content") or "" for d in data[:-1] if '"choices":[{' in d
    )
    history.append({"role": "assistant", "content": text})
    return Outcome(agent, started, ended, backend, 200, "completed")


def agent_loop(url: str, agent: int, until: float, run: Run, seed: int) -> None:
    rng = random.Random(f"{seed}-{agent}")
    history = [{"role": "system", "content": SYSTEM}]
    while time.monotonic() < until:
        outcome = one_turn(url, agent, history, rng)
        run.add(outcome)
        if outcome.kind != "completed":
            history.pop()  # the turn is sent again, as an agent retries
        if len(history) > 40:  # a new conversation, as an agent starts a new task
            history = [{"role": "system", "content": SYSTEM}]
        time.sleep(rng.uniform(0.2, 1.5))


def killer(
    sims: dict[str, SimProcess], until: float, every: tuple[float, float], run: Run, seed: int
) -> None:
    rng = random.Random(f"{seed}-killer")
    names = sorted(sims)
    turn = 0
    while True:
        wait = rng.uniform(*every)
        if time.monotonic() + wait > until - 10:
            return
        time.sleep(wait)
        name = names[turn % len(names)]
        turn += 1
        kill = Kill(name, time.monotonic())
        sims[name].kill()
        time.sleep(rng.uniform(1.0, 5.0))  # down a while (an OOM kill, a restart by the supervisor)
        sims[name].start()
        kill.back_at = time.monotonic()
        with run.lock:
            run.kills.append(kill)
        print(
            f"  killed {name} at {kill.at - START:.0f} s, back after {kill.back_at - kill.at:.1f} s",
            flush=True,
        )


def explained(outcome: Outcome, kills: list[Kill]) -> bool:
    """A failure is the fault's when its engine was killed while it ran, or it was sent while an
    engine was down (a retry found no other way) within a few seconds of a kill."""
    for kill in kills:
        if kill.at - 0.5 <= outcome.ended and outcome.started <= kill.back_at + 3.0:
            return outcome.backend in (None, kill.backend) or outcome.kind == "error-status"
    return False


START = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--kill-every", type=float, nargs=2, default=(60.0, 120.0))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    configure_logging("json", "error")
    scale = ("--time-scale", "0.1")
    sims = {
        "vllm": SimProcess("vllm", "up-vllm", "--architecture", "hybrid", *scale),
        "llama": SimProcess("llamacpp", "up-llama", "--slots", "2", *scale),
    }
    for sim in sims.values():
        sim.start()
    settings = stack_settings({name: sim.url for name, sim in sims.items()}, admin={"token": "chaos"})
    gateway = ServerThread(create_app(settings)).start()
    run = Run()
    until = time.monotonic() + args.minutes * 60
    threads = [
        threading.Thread(target=agent_loop, args=(gateway.url, a, until, run, args.seed))
        for a in range(args.agents)
    ]
    threads.append(
        threading.Thread(target=killer, args=(sims, until, tuple(args.kill_every), run, args.seed))
    )
    print(f"chaos soak: {args.agents} agents for {args.minutes:g} min, an engine killed every "
          f"{args.kill_every[0]:g}-{args.kill_every[1]:g} s", flush=True)  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.minutes * 60 + 2 * HANG_S)
    time.sleep(1.0)
    headers = {"authorization": "Bearer chaos"}
    overview = httpx.get(gateway.url + "/admin/api/overview", headers=headers).json()["backends"]
    gateway.stop()
    for sim in sims.values():
        sim.stop()
    return report(run, overview)


def report(run: Run, overview: list[dict[str, Any]]) -> int:
    kinds: dict[str, int] = {}
    for outcome in run.outcomes:
        kinds[outcome.kind] = kinds.get(outcome.kind, 0) + 1
    failures = [o for o in run.outcomes if o.kind != "completed"]
    unexplained = [o for o in failures if o.kind in ("hung", "malformed") or not explained(o, run.kills)]
    in_flight = {b["id"]: b["in_flight"] for b in overview}
    leases = {b["id"]: len(b["leases"]) for b in overview}
    print(f"requests: {len(run.outcomes)}  " + "  ".join(f"{k}: {v}" for k, v in sorted(kinds.items())))
    print(f"faults injected: {len(run.kills)} kills ({', '.join(k.backend for k in run.kills)})")
    print(f"failures explained by a kill: {len(failures) - len(unexplained)} of {len(failures)}")
    for outcome in unexplained:
        print(f"  unexplained: {outcome}")
    print(f"in flight at the end: {in_flight}  slot leases: {leases} (at most one per agent)")
    ok = (
        not unexplained
        and not kinds.get("hung")
        and not kinds.get("malformed")
        and not any(in_flight.values())
        and sum(leases.values()) <= len({o.agent for o in run.outcomes})
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
