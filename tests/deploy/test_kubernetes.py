"""deploy/kubernetes/: each manifest against its published schema (Kubernetes' own through
kubernetes-validate, the InferencePool CRD's openAPIV3Schema from the Gateway API Inference Extension,
v1.6.0), and the turnout config and endpoints file in the ConfigMap read as `turnout epp` reads them."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.epp.endpoints import read_endpoints, with_endpoints
from gateway.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
CRD = Path(__file__).parent / "data" / "inference.networking.k8s.io_inferencepools.yaml"
KUBERNETES = "1.33.0"  # the oldest release the manifests are written for (gRPC probes are GA since 1.27)


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        found += [(f"{path.name}:{doc['kind']}", doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def inference_pool_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return dict(version["schema"]["openAPIV3Schema"])


def test_every_manifest_is_checked() -> None:
    kinds = sorted(kind for kind, _ in documents())
    assert kinds == [
        "configmap.yaml:ConfigMap",
        "epp.yaml:Deployment",
        "epp.yaml:Service",
        "inferencepool.yaml:InferencePool",
    ]


@pytest.mark.parametrize(
    ("name", "doc"), [d for d in documents() if d[1]["kind"] != "InferencePool"], ids=str
)
def test_kubernetes_objects_match_kubernetes_schemas(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # strict: no field the API does not know


def test_a_schema_check_catches_a_wrong_manifest() -> None:
    deployment = next(doc for _, doc in documents() if doc["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_the_inference_pool_matches_its_crd() -> None:
    pool = next(doc for _, doc in documents() if doc["kind"] == "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    validator = jsonschema.Draft7Validator(inference_pool_schema())
    assert [e.message for e in validator.iter_errors(pool)] == []
    # the CRD's CEL rules, which a JSON schema cannot say: ports unique, a Service picker names its port
    ports = [p["number"] for p in pool["spec"]["targetPorts"]]
    assert len(ports) == len(set(ports))
    picker = pool["spec"]["endpointPickerRef"]
    assert picker.get("kind", "Service") != "Service" or "port" in picker
    wrong = yaml.safe_load(yaml.safe_dump(pool))
    wrong["spec"]["endpointPickerRef"]["failureMode"] = "FailSometimes"
    assert list(validator.iter_errors(wrong))


def test_the_pool_the_service_and_the_deployment_agree() -> None:
    docs = {doc["kind"]: doc for _, doc in documents()}
    pool, service, deployment = docs["InferencePool"], docs["Service"], docs["Deployment"]
    picker = pool["spec"]["endpointPickerRef"]
    assert (picker["name"], picker["port"]["number"]) == (
        service["metadata"]["name"],
        service["spec"]["ports"][0]["port"],
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--listen") + 1].endswith(":9002")
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert {p["metadata"]["namespace"] for p in docs.values()} == {"inference"}


def test_the_configmap_is_a_config_turnout_epp_reads(tmp_path: Path) -> None:
    config = next(doc for _, doc in documents() if doc["kind"] == "ConfigMap")["data"]
    data = tomllib.loads(config["turnout.toml"])
    (tmp_path / "endpoints.yaml").write_text(config["endpoints.yaml"])
    settings = with_endpoints(load_settings(None, **data), read_endpoints(tmp_path / "endpoints.yaml"))
    assert {b.id: str(b.url) for b in settings.backends} == {
        "vllm": "http://10.96.0.20:8000/", "llama-moe": "http://10.96.0.21:8000/",
    }  # fmt: skip
