"""What the engine profile changes: the same workloads replayed (virtual time) with the llama-server on
each profile, everything else equal (docs/benchmarks.md, "Engine profiles").

    python bench/profiles.py                 # agent + contention, 6 llama profiles, 4 routing profiles

The fleet is ``bench/fleets/workstation-profiles.toml`` (vLLM TP2 on the workstation's derived profile
beside one 2-slot llama-server); only the llama-server's ``engine_profile`` changes: the seeds' linear
3,000 tok/s, Flash-Next with its experts in RAM as derived for the workstation (compose's flags), and
the four profiles measured on the H200 (experts memory-mapped with 512-, 2048- and 4096-token
micro-batches; pinned experts with 4096-token batches). Prints, per workload
and llama profile, each routing profile's mean TTFT, p90, session completion and the share of requests
that went to llama.cpp. Deterministic: the same inputs give the same table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLEET = REPO / "bench" / "fleets" / "workstation-profiles.toml"
LLAMA_PROFILES = (
    "seed-5090-llamacpp-27b",
    "workstation-llamacpp-flash-next-cpu-moe",
    "h200-llamacpp-flash-next-shape-mmap512",
    "h200-llamacpp-flash-next-shape-mmap2048",
    "h200-llamacpp-flash-next-shape-mmap4096",
    "h200-llamacpp-flash-next-shape-pinned",
)
ROUTING = ("cost", "prefer-vllm", "prefer-llamacpp")
WORKLOADS = {
    "agent": ["agent", "--agents", "4", "--turns", "12", "--max-context", "24000"],
    "contention": ["contention"],
}


def turnout(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gateway", *args], check=True, cwd=REPO, capture_output=True)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(
            "| workload | llama.cpp profile | routing | ttft mean | p90 | session completion | to llama.cpp |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for workload, trace_args in WORKLOADS.items():
            trace = work / f"{workload}.jsonl"
            turnout("trace", *trace_args, "--out", str(trace))
            for llama in LLAMA_PROFILES:
                fleet = work / f"{llama}.toml"
                fleet.write_text(FLEET.read_text().replace('"seed-5090-llamacpp-27b"', f'"{llama}"'))
                report = work / f"{workload}-{llama}.json"
                routing = [arg for name in ROUTING for arg in ("--profile", name)]
                turnout("replay", str(trace), "--backends", str(fleet), *routing, "--json", str(report))
                profiles = json.loads(report.read_text())["profiles"]
                for name in (*ROUTING, "oracle"):
                    row = profiles[name]
                    share = row["backend_share"].get("llama", 0.0)
                    cells = [_num(row[k]) for k in ("ttft_mean_s", "ttft_p90_s", "session_completion_mean_s")]
                    print(f"| {workload} | {llama} | {name} | {' | '.join(cells)} | {share:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
