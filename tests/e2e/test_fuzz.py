"""Hostile input: schemathesis, from ``/schema/openapi.json``, against the gateway on the simulators.

Every operation gets requests that match its schema (positive) and requests that break it
(negative). Each answer must be documented: no 500, a status the schema lists, its content type,
and a body (or, for streams, every event's data) that matches the schema. Half the generated
requests name a model the gateway serves, so they reach routing, the engines and the relay rather
than stopping at ``model_not_found``.

The count is bounded (``TURNOUT_FUZZ_EXAMPLES`` per operation and mode, 15 by default, derandomized
so ``make test`` is repeatable); ``make fuzz`` runs a longer campaign with a fresh seed and prints
what was sent and answered (docs/reliability.md).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.api.document import OPERATIONS
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.servers import ADMIN

EXAMPLES = int(os.environ.get("TURNOUT_FUZZ_EXAMPLES", "15"))
SEED = os.environ.get("TURNOUT_FUZZ_SEED")  # unset: derandomized


@schemathesis.check
def no_internal_error(ctx: Any, response: Any, case: Any) -> None:
    """A 500 is the gateway failing; 502 and 503 are answers (the engine failed; no backend can take it)."""
    if response.status_code == 500:
        raise AssertionError(f"500 Internal Server Error: {response.text[:500]}")


CHECKS = [
    no_internal_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
SERVED = ["m-both", "m-vllm", "m-llama", "both"]
KEY = {"authorization": "Bearer sk-fuzz"}
MODES = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """The usual stack behind an API key with limits, so keys, limits and their errors are fuzzed too."""
    key = {"name": "fuzz", "key": "sk-fuzz", "concurrent": 16, "tokens_per_minute": 50_000_000}
    running = start_stack(auth={"keys": [key]})
    try:
        yield running
    finally:
        stop_stack(running)


@pytest.fixture(scope="module")
def api(stack: Stack) -> Any:
    return schemathesis.openapi.from_url(stack.url + "/schema/openapi.json")


@pytest.fixture(scope="module")
def tally(request: pytest.FixtureRequest) -> Iterator[Counter[tuple[str, str, int]]]:
    """(operation, mode, status) -> responses; printed after a longer campaign (``make fuzz``)."""
    counts: Counter[tuple[str, str, int]] = Counter()
    yield counts
    if "TURNOUT_FUZZ_EXAMPLES" in os.environ:
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        lines = [f"fuzz: {sum(counts.values())} requests, {EXAMPLES} examples per operation and mode"]
        operations = sorted({(op, mode) for op, mode, _ in counts})
        for op, mode in operations:
            statuses = sorted((s, n) for (o, m, s), n in counts.items() if (o, m) == (op, mode))
            lines.append(f"  {op:<48} {mode:<8} " + ", ".join(f"{s}: {n}" for s, n in statuses))
        with capture.global_and_fixture_disabled():
            print("\n" + "\n".join(lines))


def aim(case: Any, model: str | None) -> None:
    """Name a served model (``model`` not None) where the case names one, so the request goes deeper."""
    if model is None:
        return
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = model
    if "model_id" in (case.path_parameters or {}):
        case.path_parameters["model_id"] = model


@pytest.mark.timeout(600)  # examples, shrinking and a 30 s call each: a busy machine needs the room
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize(("method", "path"), sorted(OPERATIONS), ids=lambda v: str(v))
def test_every_answer_is_documented(
    api: Any, tally: Counter[tuple[str, str, int]], method: str, path: str, mode: Any
) -> None:
    operation = api[path][method.upper()]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=SEED is None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(case=operation.as_strategy(mode), model=st.sampled_from([*SERVED, None, None, None, None]))
    def run(case: Any, model: str | None) -> None:
        aim(case, model)
        response = case.call(headers=ADMIN if path.startswith("/admin/") else KEY, timeout=30)
        tally[(f"{method.upper()} {path}", mode.value, response.status_code)] += 1
        case.validate_response(response, checks=CHECKS)

    if SEED is not None:
        run = seed(int(SEED))(run)
    try:
        run()
    except Unsatisfiable:  # only strings and optional fields: nothing a request can break
        assert mode is schemathesis.GenerationMode.NEGATIVE
        pytest.skip("no request can break this operation's schema")
