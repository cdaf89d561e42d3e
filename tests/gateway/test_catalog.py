"""The window a model is offered with: the largest it can be routed to now."""

from __future__ import annotations

from msgspec.structs import replace

from gateway.catalog import Catalog, max_output_tokens
from gateway.settings import ModelConfig
from policies.types import BackendSnapshot, EngineKind, Health


def _catalog(**model: object) -> Catalog:
    config = ModelConfig.model_validate(
        {
            "name": "m",
            "deployments": [
                {"backend": "vllm", "upstream_name": "m", "context_window": 94_000},
                {"backend": "llama", "upstream_name": "m"},
            ],
            **model,
        }
    )
    return Catalog([config], created=0)


def _snapshot(catalog: Catalog, backend: str, health: Health, window: int | None) -> BackendSnapshot:
    deployments = tuple(replace(d, context_window=window) for d in catalog.deployments_on(backend))
    kind = EngineKind.VLLM if backend == "vllm" else EngineKind.LLAMACPP
    return BackendSnapshot(backend, kind, health, 0.0, deployments=deployments)


def test_window_is_the_largest_on_backends_that_take_requests() -> None:
    catalog = _catalog()
    model = catalog.models[0]
    both = [
        _snapshot(catalog, "vllm", Health.READY, 94_000),
        _snapshot(catalog, "llama", Health.READY, 65_536),
    ]
    assert catalog.window(model, both) == 94_000
    vllm_down = [replace(both[0], health=Health.DOWN), both[1]]
    assert catalog.window(model, vllm_down) == 65_536
    all_down = [replace(s, health=Health.DOWN) for s in both]
    assert catalog.window(model, all_down) == 94_000  # what it will be once they are back
    assert catalog.window(model, []) == 94_000  # before the first probe: the configured window


def test_max_output_tokens() -> None:
    model = _catalog().models[0]
    assert max_output_tokens(model, 94_000) == 23_500
    assert max_output_tokens(model, 200_000) == 32_000
    assert max_output_tokens(model, None) == 32_000
    configured = _catalog(max_output_tokens=8192).models[0]
    assert max_output_tokens(configured, 94_000) == 8192
    assert max_output_tokens(configured, 4096) == 4096
