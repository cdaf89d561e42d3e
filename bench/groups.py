"""A model group against its members: the same workloads sent to the group ``qwen3.8`` and pinned to
each member, in virtual time (issue #28; docs/benchmarks.md, "Model groups").

    python bench/groups.py

The fleet is ``bench/fleets/workstation-group.toml``: deploy/turnout.toml's shape, the 27B on vLLM (the
workstation's derived TP2 profile, 32k window, the default member) and Flash-Next on a 2-slot
llama-server (32k a slot), one model each. The llama-server runs on two profiles in turn: its experts
in memory-mapped RAM as compose ships it (derived for the workstation), and pinned with 4096-token
batches (measured on the H200). Workloads: agent (4 agents x 12 turns growing to 31k tokens),
contention (6 agents x 8 turns over a shared 6k system prompt, one-off questions between) and chat
(one-off requests at 70% of the group's prefill capacity). Each workload runs three times with the
same arrivals: to the group, to ``qwen3.8-27b`` only, to ``qwen3.8-flash-next`` only.

Targets, printed as MET or MISSED with the numbers:
- the group's mean TTFT and mean completion are never worse than the better member's;
- on the agent workload, the 27B alone's mean TTFT over prompts of 30k+ tokens is at least 2x the
  group's; a miss says whether any routing could reach it (the replay's lower bound: each request
  alone on its best engine with all the reuse it could have had).
Deterministic: the same inputs give the same table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FLEET = REPO / "bench" / "fleets" / "workstation-group.toml"
GROUP, SMALL, LARGE = "qwen3.8", "qwen3.8-27b", "qwen3.8-flash-next"
BOUND = "lower-bound"
"""The replay's yardstick no routing can beat (``gateway.replay.yardsticks``)."""
LLAMA_PROFILES = {
    "experts in RAM (compose)": "workstation-llamacpp-flash-next-cpu-moe",
    "experts pinned": "h200-llamacpp-flash-next-shape-pinned",
}
WORKLOADS = {
    "agent": ["agent", "--agents", "4", "--turns", "12", "--max-context", "31000"],
    "contention": ["contention", "--turns", "8"],
    "chat": ["chat"],
}
LOAD = {"chat": 0.7}
"""Workloads replayed at this share of the group's prefill capacity (the others at their own pace)."""
LONG_FACTOR = 2.0


def turnout(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gateway", *args], check=True, cwd=REPO, capture_output=True)


def replay(trace: Path, fleet: Path, model: str, out: Path, *pace: str) -> dict[str, Any]:
    turnout(
        "replay",
        str(trace),
        "--backends",
        str(fleet),
        "--model",
        model,
        "--no-oracle",
        "--json",
        str(out),
        *pace,
    )
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def verdicts(workload: str, rows: dict[str, dict[str, Any]]) -> list[str]:
    """Each target of one workload on one llama.cpp profile: MET or MISSED, with the numbers."""
    out = []
    group = rows[GROUP]
    for key, what in (("ttft_mean_s", "mean TTFT"), ("completion_mean_s", "mean completion")):
        members = [rows[m][key] for m in (SMALL, LARGE) if rows[m][key] is not None]
        if group[key] is None or not members:
            out.append(f"MISSED: {what}: no request completed")
            continue
        better = min(members)
        met = group[key] <= better + 1e-9
        out.append(
            f"{'MET' if met else 'MISSED'}: {what} {group[key]:.2f} s vs the better member's {better:.2f} s"
        )
    if workload == "agent":
        alone, grouped = rows[SMALL]["ttft_mean_long_s"], group["ttft_mean_long_s"]
        if alone is None or grouped is None:
            out.append("MISSED: no prompt of 30k+ tokens completed")
        else:
            factor = alone / grouped
            met = factor >= LONG_FACTOR
            verdict = (
                f"{'MET' if met else 'MISSED'}: prompts >= 30k: the 27B alone {alone:.2f} s, "
                f"the group {grouped:.2f} s ({factor:.2f}x, target {LONG_FACTOR:g}x)"
            )
            bound = rows[BOUND]["ttft_mean_long_s"]
            if not met and bound:
                verdict += (
                    f"; no routing can reach it: each of these requests alone on its best engine with all"
                    f" the reuse it could have had averages {bound:.2f} s ({alone / bound:.2f}x at most)"
                )
            out.append(verdict)
    return out


def main() -> int:
    columns = ("llama.cpp", "workload", "sent to", "ttft mean", "p90", "ttft >= 30k", "completion", "session",
               "tok/s", "to llama.cpp", "sessions moved")  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        traces = {}
        for workload, trace_args in WORKLOADS.items():
            traces[workload] = work / f"{workload}.jsonl"
            turnout("trace", *trace_args, "--out", str(traces[workload]))
        for label, profile in LLAMA_PROFILES.items():
            fleet = work / f"{profile}.toml"
            fleet.write_text(
                FLEET.read_text().replace('"workstation-llamacpp-flash-next-cpu-moe"', f'"{profile}"')
            )
            for workload, trace in traces.items():
                pace: tuple[str, ...] = ()
                if workload in LOAD:  # the group's pace (as the report rounds it), for all three runs
                    paced = replay(trace, fleet, GROUP, work / "r.json", "--load", str(LOAD[workload]))
                    pace = ("--rate", str(paced["meta"]["rate"]))
                rows: dict[str, dict[str, Any]] = {}
                for model in (GROUP, SMALL, LARGE):
                    report = replay(trace, fleet, model, work / "r.json", *pace)
                    row = report["profiles"]["cost"]
                    rows[model] = row
                    if model == GROUP:
                        rows[BOUND] = report["profiles"][BOUND]
                    cells = [
                        _num(row["ttft_mean_s"]), _num(row["ttft_p90_s"]), _num(row["ttft_mean_long_s"]),
                        _num(row["completion_mean_s"]), _num(row["session_completion_mean_s"], 1),
                        _num(row["throughput_tok_s"], 1), f"{row['backend_share'].get('llama', 0.0):.0%}",
                        "-" if row["sessions_moved"] is None else f"{row['sessions_moved']:.0%}",
                    ]  # fmt: skip
                    errors = f" ({row['errors']} refused: too long for both)" if row["errors"] else ""
                    print(f"| {label} | {workload}{errors} | {model} | {' | '.join(cells)} |")
                notes.extend(f"{label}, {workload}: {v}" for v in verdicts(workload, rows))
    print()
    for note in notes:
        print(f"- {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
