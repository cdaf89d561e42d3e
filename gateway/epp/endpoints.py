"""Where the engines are, from an endpoints file in llm-d's file-discovery format (the EPP's
``file-discovery`` plugin, llm-d/llm-d-router ``docs/discovery.md``; ``turnout epp --endpoints``)::

    endpoints:
      - name: vllm-0                  # required: a backend id
        address: "10.0.0.1"           # required: an IP address (Envoy's ORIGINAL_DST connects to it)
        port: "8000"                  # required: 1-65535 (a string in llm-d's format; a number too)
        namespace: inference          # optional (default "default"): kept for the file's sake
        labels:
          turnout.dev/backend: vllm   # optional: the configured backend this one replicates

Each endpoint is a backend: the configured backend it replicates (the label), else the configured
backend of its own name, gives it its kind, settings and model deployments; the endpoint gives its
address. A configured backend that endpoints replicate (or name) is replaced by them: the file is
the pool. Configured backends the file does not mention stay as configured. The file is read when
the picker starts (a Kubernetes Deployment restarts it when its ConfigMap changes).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import yaml

from gateway.settings import Settings
from gateway.settings_fleet import BackendConfig, DeploymentConfig, ModelConfig

MAX_FILE_BYTES = 1 << 20
"""llm-d's limit for an endpoints file."""
BACKEND_LABEL = "turnout.dev/backend"


class EndpointsError(ValueError):
    """An endpoints file turnout cannot use, with what is wrong and where."""


class EndpointEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    address: str
    port: str | int
    namespace: str = "default"
    labels: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"


class EndpointsFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    endpoints: list[EndpointEntry]


def read_endpoints(path: Path) -> list[EndpointEntry]:
    """The endpoints of ``path`` (YAML or JSON), checked; ``EndpointsError`` says what is wrong."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise EndpointsError(f"{path}: cannot read the endpoints file: {exc.strerror}") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise EndpointsError(f"{path}: larger than {MAX_FILE_BYTES:,} bytes")
    try:
        data: Any = yaml.safe_load(raw) if path.suffix != ".json" else json.loads(raw)
        parsed = msgspec.convert(data, EndpointsFile)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise EndpointsError(
            f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}"
        ) from exc
    except msgspec.ValidationError as exc:
        raise EndpointsError(f"{path}: {exc}") from exc
    for index, entry in enumerate(parsed.endpoints):
        where = f"{path}: endpoints[{index}] ({entry.name})"
        try:
            ipaddress.ip_address(entry.address)
        except ValueError:
            raise EndpointsError(f"{where}: address {entry.address!r} is not an IP address") from None
        if not str(entry.port).isdigit() or not 1 <= int(entry.port) <= 65535:
            raise EndpointsError(f"{where}: port {entry.port!r} is not a port number (1-65535)")
    names = [entry.name for entry in parsed.endpoints]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise EndpointsError(f"{path}: endpoint name {repeated[0]!r} is used twice")
    return parsed.endpoints


def with_endpoints(settings: Settings, endpoints: Sequence[EndpointEntry]) -> Settings:
    """``settings`` with the engines where ``endpoints`` put them (module docstring)."""
    configured = {backend.id: backend for backend in settings.backends}
    replicas: dict[str, list[EndpointEntry]] = {}
    for entry in endpoints:
        template = entry.labels.get(BACKEND_LABEL, entry.name)
        if template not in configured:
            label = f"its label {BACKEND_LABEL} names" if BACKEND_LABEL in entry.labels else "it names"
            raise EndpointsError(
                f"endpoint {entry.name!r}: {label} no configured backend {template!r}"
                f" (configured: {', '.join(configured) or 'none'})"
            )
        replicas.setdefault(template, []).append(entry)
    backends: list[BackendConfig] = []
    for backend in settings.backends:
        if backend.id not in replicas:
            backends.append(backend)
            continue
        for entry in replicas[backend.id]:
            data = {**backend.model_dump(), "id": entry.name, "url": entry.url}
            try:
                backends.append(BackendConfig.model_validate(data))
            except ValueError as exc:
                raise EndpointsError(f"endpoint {entry.name!r}: {exc}") from exc
    ids = [backend.id for backend in backends]
    clash = sorted({i for i in ids if ids.count(i) > 1})
    if clash:
        raise EndpointsError(f"endpoint {clash[0]!r}: a configured backend has that id already")
    models = [_replicated(model, replicas) for model in settings.models]
    return settings.model_copy(update={"backends": tuple(backends), "models": tuple(models)})


def _replicated(model: ModelConfig, replicas: dict[str, list[EndpointEntry]]) -> ModelConfig:
    """``model`` deployed on every replica of each backend it was deployed on."""
    deployments: list[DeploymentConfig] = []
    for deployment in model.deployments:
        entries = replicas.get(deployment.backend)
        if entries is None:
            deployments.append(deployment)
        else:
            deployments += [deployment.model_copy(update={"backend": e.name}) for e in entries]
    return model.model_copy(update={"deployments": tuple(deployments)})
