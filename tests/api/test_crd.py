"""The committed CRD matches the models; every field is described; CEL rules and columns exist;
the examples validate (or are refused) against both pydantic and the CRD's schema."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pydantic
import pytest
import yaml

from agentrun.api import crdgen
from agentrun.api.spec import AgentRunSpec

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "agentrun.dev_agentruns.yaml"
REFERENCE = ROOT / "docs" / "crd-reference.md"
EXAMPLES = ROOT / "examples"


def _schema() -> dict:
    return crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _walk(node: dict, path: str = ""):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}" if path else name)
    if "items" in node:
        yield from _walk(node["items"], path + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], path + ".*")


def test_committed_crd_matches_models():
    assert CRD_FILE.read_text() == crdgen.render_crd(), "crds/ drifted from the models: run `make crds`"


def test_committed_reference_matches_models():
    assert REFERENCE.read_text() == crdgen.render_reference(), "docs/crd-reference.md drifted: run `make crds`"


def test_every_field_has_a_description():
    assert crdgen.undocumented_fields(_schema()) == []


def test_undocumented_field_is_detected():
    schema = copy.deepcopy(_schema())
    del schema["properties"]["spec"]["properties"]["budget"]["properties"]["maxLaps"]["description"]
    assert crdgen.undocumented_fields(schema) == ["spec.budget.maxLaps"]


def test_schema_is_structural():
    for path, node in _walk(_schema()):
        for bad in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "nullable", "title", "const"):
            assert bad not in node, f"{path} has {bad}"
        if path and path != "metadata":
            assert "type" in node, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path}: unbounded list (CEL cost budget)"


def test_strings_under_cel_rules_are_bounded():
    spec = _schema()["properties"]["spec"]
    assert spec["properties"]["task"]["maxLength"] == 65536
    assert spec["properties"]["agent"]["properties"]["tools"]["items"]["properties"]["name"]["maxLength"] == 64


def test_cel_rules_present_and_name_fields():
    spec = _schema()["properties"]["spec"]
    task_rules = spec["properties"]["task"]["x-kubernetes-validations"]
    assert {"rule": "self == oldSelf", "message": task_rules[0]["message"]} == task_rules[0]
    assert "spec.task" in task_rules[0]["message"]
    tools = spec["properties"]["agent"]["properties"]["tools"]
    assert tools["x-kubernetes-list-type"] == "map" and tools["x-kubernetes-list-map-keys"] == ["name"]
    assert "unique" in tools["x-kubernetes-validations"][0]["message"]
    assert "spec.approval.owner" in spec["x-kubernetes-validations"][0]["message"]
    for path, rules in crdgen.CEL_RULES.items():
        for rule in rules:
            assert rule["message"].startswith("spec."), (path, rule)


def test_preserve_unknown_fields_where_the_model_says():
    tool = _schema()["properties"]["spec"]["properties"]["agent"]["properties"]["tools"]["items"]
    assert tool["properties"]["parameters"]["x-kubernetes-preserve-unknown-fields"] is True
    assert "x-kubernetes-preserve-unknown-fields" not in tool["properties"]["http"]


def test_status_subresource_names_and_columns():
    crd = crdgen.crd()
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["ar"] and "all" in names["categories"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    cols = {c["name"]: c for c in version["additionalPrinterColumns"]}
    for name in ("Phase", "Lap", "Version", "Cost", "Waiting-On", "Last-Checkpoint", "Age"):
        assert name in cols and not cols[name].get("priority")
    assert cols["Retries"]["priority"] == 1 and cols["Message"]["priority"] == 1
    assert cols["Last-Checkpoint"]["type"] == "date"
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def _validate_crd(doc: dict) -> None:
    jsonschema.validate(doc, _schema(), cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize("name", ["simple-run.yaml", "approval-run.yaml"])
def test_examples_validate_against_models_and_crd(name):
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    AgentRunSpec.model_validate(doc["spec"])
    _validate_crd(doc)


def test_invalid_example_is_refused_naming_the_field():
    doc = yaml.safe_load((EXAMPLES / "invalid-run.yaml").read_text())
    with pytest.raises(pydantic.ValidationError) as err:
        AgentRunSpec.model_validate(doc["spec"])
    assert "maxLaps" in str(err.value)
    with pytest.raises(jsonschema.ValidationError) as err2:
        _validate_crd(doc)
    assert list(err2.value.absolute_path) == ["spec", "budget", "maxLaps"]


def test_crd_file_is_valid_yaml_for_kubectl():
    docs = [d for d in yaml.safe_load_all(CRD_FILE.read_text()) if d]
    assert len(docs) == 1 and docs[0]["metadata"]["name"] == "agentruns.agentrun.dev"


def test_the_pod_template_refuses_reserved_keys_in_every_crd_that_holds_an_agent():
    """The AgentRun (spec.agent.podTemplate), the Agent (spec.podTemplate) and the AgentSchedule's run
    template carry the same rules; the reserved keys are the models' (tests/controller/test_decide_jobs.py
    ties them to what build_job sets)."""
    from agentrun.api import schedule
    from agentrun.api.spec import RESERVED_LABEL_KEYS, RESERVED_LABEL_PREFIXES

    run = _schema()["properties"]["spec"]["properties"]["agent"]["properties"]["podTemplate"]
    agent = crdgen.agent_openapi_schema()["properties"]["spec"]["properties"]["podTemplate"]
    sched = schedule.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    sched_tpl = sched["properties"]["spec"]["properties"]["runTemplate"]["properties"]["spec"]["properties"][
        "agent"]["properties"]["podTemplate"]
    assert run == agent == sched_tpl
    rules = " ".join(r["rule"] for r in run["properties"]["labels"]["x-kubernetes-validations"])
    for key in (*RESERVED_LABEL_PREFIXES, *RESERVED_LABEL_KEYS):
        assert f"'{key}'" in rules
    assert run["properties"]["labels"]["maxProperties"] == 32
    assert run["properties"]["affinity"]["properties"]["nodeAffinity"]["x-kubernetes-preserve-unknown-fields"] is True
    assert "x-kubernetes-preserve-unknown-fields" not in run["properties"]["tolerations"]["items"]
