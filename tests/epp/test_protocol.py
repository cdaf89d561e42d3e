"""The Endpoint Picker protocol, spoken to the picker directly over gRPC (as Envoy or any GIE
gateway would): the destination in the header and the ``envoy.lb`` metadata, the subset hint, the
503 when nothing fits, the health services."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from backends.sim import SimConfig, create_sim_app
from gateway.epp import wire
from gateway.epp.exchange import endpoint_address
from tests.e2e.conftest import stack_settings
from tests.epp.envoy import PickerThread
from tests.servers import ServerThread


class Picked:
    def __init__(self, sims: dict[str, ServerThread], picker: PickerThread) -> None:
        self.sims, self.picker = sims, picker
        self.channel = grpc.insecure_channel(f"127.0.0.1:{picker.port}")

    def address(self, backend: str) -> str:
        return endpoint_address(self.sims[backend].url)

    def exchange(self, body: dict[str, Any], subset: list[str] | str | None = None) -> list[Any]:
        """One request's messages (headers, body) and the picker's answers to them."""
        headers = pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
                    base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions"),
                    base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
                ]
            )
        )
        metadata = base_pb2.Metadata()
        if subset is not None:
            hint = struct_pb2.Struct()
            hint.update({wire.SUBSET: subset})
            metadata.filter_metadata[wire.SUBSET_NAMESPACE].CopyFrom(hint)
        messages = [
            pb.ProcessingRequest(request_headers=headers, metadata_context=metadata),
            pb.ProcessingRequest(
                request_body=pb.HttpBody(body=json.dumps(body).encode(), end_of_stream=True)
            ),
        ]
        stub = pb_grpc.ExternalProcessorStub(self.channel)
        return list(stub.Process(iter(messages), timeout=10))


@pytest.fixture(scope="module")
def picked() -> Iterator[Picked]:
    configs = {
        "vllm": SimConfig(kind="vllm", model="up-vllm", time_scale=0.002),
        "llama": SimConfig(kind="llamacpp", model="up-llama", time_scale=0.002, slots=2),
    }
    sims = {name: ServerThread(create_sim_app(config)).start() for name, config in configs.items()}
    picker = PickerThread(stack_settings({n: s.url for n, s in sims.items()})).start()
    try:
        yield Picked(sims, picker)
    finally:
        picker.stop()
        for server in sims.values():
            server.stop()


def destination(answers: list[Any]) -> tuple[str, str]:
    """The endpoint in the header mutation and the one in the ``envoy.lb`` metadata."""
    first = answers[0]
    assert first.WhichOneof("response") == "request_headers"
    headers = {
        h.header.key: h.header.raw_value.decode()
        for h in first.request_headers.response.header_mutation.set_headers
    }
    metadata = first.dynamic_metadata.fields[wire.DESTINATION_NAMESPACE].struct_value.fields[wire.DESTINATION]
    return headers[wire.DESTINATION], metadata.string_value


def body_sent(answers: list[Any]) -> bytes:
    chunks = [a.request_body.response.body_mutation.streamed_response for a in answers[1:]]
    assert chunks[-1].end_of_stream
    return b"".join(c.body for c in chunks)


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_the_destination_goes_in_the_header_and_the_metadata_then_the_body(picked: Picked) -> None:
    answers = picked.exchange(chat("m-llama"))
    header, metadata = destination(answers)
    assert header == metadata == picked.address("llama")
    first = answers[0].request_headers.response
    assert first.clear_route_cache
    assert "content-length" in first.header_mutation.remove_headers
    assert json.loads(body_sent(answers))["model"] == "up-llama"


def test_the_subset_hint_narrows_the_pool(picked: Picked) -> None:
    """``m-both`` lives on both engines; the data plane allows one, as a list or a comma-separated
    string, by ``ip:port``."""
    for backend in ("llama", "vllm"):
        for hint in ([picked.address(backend)], f"{picked.address(backend)},10.9.9.9:1"):
            assert destination(picked.exchange(chat("m-both"), hint))[0] == picked.address(backend)


@pytest.mark.parametrize("hint", [[], ["10.9.9.9:8000"]], ids=["empty", "no-such-endpoint"])
def test_a_subset_hint_nothing_fits_is_a_503(picked: Picked, hint: list[str]) -> None:
    answers = picked.exchange(chat("m-both"), hint)
    assert len(answers) == 1
    immediate = answers[0].immediate_response
    assert immediate.status.code == 503
    assert json.loads(immediate.body)["error"]["type"]


def test_the_health_services_the_protocol_names(picked: Picked) -> None:
    stub = health_pb2_grpc.HealthStub(picked.channel)
    for service in wire.HEALTH_SERVICES:
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as unknown:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert unknown.value.code() is grpc.StatusCode.NOT_FOUND
