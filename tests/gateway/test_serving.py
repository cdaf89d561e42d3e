"""``turnout serve``'s start-up: the heap it built is frozen before it serves (``settle_heap``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar

from gateway import serving
from gateway.settings import load_settings

CONFIG = """\
[[backends]]
id = "vllm"
kind = "vllm"
url = "http://127.0.0.1:9"

[[models]]
name = "m"
[[models.deployments]]
backend = "vllm"
upstream_name = "m"
"""


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        yield
    finally:  # the rest of the suite runs with Python's own collector settings
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_the_app_is_built_then_frozen_and_full_collections_are_rarer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unfrozen: None
) -> None:
    """The full collections under load walk only what requests built, not the start-up heap, and
    come ten times less often than Python's default."""
    frozen_at_serve: list[int] = []
    young, middle, _ = gc.get_threshold()

    def serve(self: Any) -> None:
        frozen_at_serve.append(gc.get_freeze_count())
        assert gc.get_threshold() == (young, middle, serving.FULL_COLLECTION_EVERY)
        assert isinstance(self.app, Litestar)  # built before the freeze, so frozen with the rest

    monkeypatch.setattr(serving.GracefulServer, "run", serve)
    monkeypatch.setattr("gateway.logging.configure_logging", lambda *_: None)  # global: the suite's own stays
    config = tmp_path / "turnout.toml"
    config.write_text(CONFIG, encoding="utf-8")
    assert gc.get_freeze_count() == 0
    serving.run_gateway(load_settings(config))
    assert frozen_at_serve
    assert frozen_at_serve[0] > 10_000
