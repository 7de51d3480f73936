"""The AgentSchedule CRD: generated from api/schedule.py, committed in crds/ and the chart, every
field described, structural, the run template is the AgentRun's spec with its rules, and the
schedule's shape checks refuse what they should (the cron expression itself is the operator's)."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest

from agentrun.api import crdgen
from agentrun.api import schedule as s
from agentrun.api.schedule import MACROS, SCHEDULE_PATTERN, TIME_ZONE_PATTERN, run_name

ROOT = Path(__file__).resolve().parents[2]


def _schema() -> dict:
    return s.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_and_chart_copy_match_the_models():
    text = s.render_crd()
    assert (ROOT / "crds" / "agentrun.dev_agentschedules.yaml").read_text() == text, "run `make crds`"
    assert (ROOT / "helm" / "agentrun-operator" / "crds" / "agentrun.dev_agentschedules.yaml").read_text() == text, \
        "run `make helm-crds`"


def test_every_field_is_described_and_the_schema_is_structural():
    schema = _schema()
    assert crdgen.undocumented_fields(schema) == []

    def walk(node: dict, path: str = "") -> None:
        for bad in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "const"):
            assert bad not in node, f"{path} has {bad}"
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}")
        if "items" in node:
            walk(node["items"], path + "[]")
    walk(schema)


def test_run_template_is_the_agentrun_spec_with_its_rules_but_no_transition_rules():
    run_spec = crdgen.openapi_schema()["properties"]["spec"]
    tmpl = _schema()["properties"]["spec"]["properties"]["runTemplate"]["properties"]["spec"]
    assert set(tmpl["properties"]) == set(run_spec["properties"])
    rules = [r for rs in s.CEL_RULES.values() for r in rs]
    assert not any("oldSelf" in r["rule"] for r in rules)
    tools = tmpl["properties"]["agent"]["properties"]["tools"]["x-kubernetes-validations"]
    assert tools[0]["message"] == "spec.runTemplate.spec.agent.tools: tool names must be unique"
    msgs = [r["message"] for r in tmpl["x-kubernetes-validations"]]
    assert any(m.startswith("spec.runTemplate.spec.approval.owner is required") for m in msgs)
    assert any(m.startswith("spec.runTemplate.spec.cancel cannot be set") for m in msgs)


@pytest.mark.parametrize("good", ["* * * * *", "0 3 * * *", "*/15 9-17 * * mon-fri", "0 0 1,15 * *", "@daily",
                                  "@hourly", "0 0 L * *", "5 4 * * sun"])
def test_schedule_shape_lets_cron_through(good):
    assert re.fullmatch(SCHEDULE_PATTERN, good)


@pytest.mark.parametrize("bad", ["", "* * * *", "* * * * * *", "@every 5m", "@reboot", "CRON_TZ=UTC 0 * * * *",
                                 "0 3 * * *\n", "TZ=Europe/Berlin 0 3 * * *"])
def test_schedule_shape_refuses_what_is_not_five_fields(bad):
    assert not re.fullmatch(SCHEDULE_PATTERN, bad)


def test_macros_are_the_descriptors_the_pattern_allows():
    for m in MACROS:
        assert re.fullmatch(SCHEDULE_PATTERN, m)


@pytest.mark.parametrize(("tz", "ok"), [("UTC", True), ("Europe/Berlin", True), ("America/Argentina/Buenos_Aires", True),
                                        ("Etc/GMT+5", True), ("../etc/passwd", False), ("/abs", False), ("a b", False)])
def test_time_zone_shape(tz, ok):
    assert bool(re.fullmatch(TIME_ZONE_PATTERN, tz)) is ok


def test_the_schema_validates_an_example_and_refuses_a_bad_one():
    schema = _schema()
    good = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentSchedule", "metadata": {"name": "nightly"},
            "spec": {"schedule": "0 3 * * *", "timeZone": "Europe/Berlin", "concurrencyPolicy": "Forbid",
                     "runTemplate": {"metadata": {"labels": {"team": "a"}},
                                     "spec": {"task": "t", "agent": {"version": "v1", "model": {"provider": "scripted",
                                                                                                "script": [{}]}}}}}}
    jsonschema.validate(good, schema)
    bad = {**good, "spec": {**good["spec"], "concurrencyPolicy": "Sometimes"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_run_names_fit_a_dns_label():
    from datetime import UTC, datetime

    name = "a" * s.MAX_NAME_CHARS
    assert len(run_name(name, datetime(9999, 12, 31, 23, 59, tzinfo=UTC))) <= 63
    assert run_name("nightly", datetime(2030, 1, 1, tzinfo=UTC)) == "nightly-31557600"


def test_no_category_shadows_a_resource_name():
    """kubectl expands a category before it maps a resource name: a category "agentrun" holding the
    schedules made `kubectl get agentrun NAME` look for an AgentSchedule NAME too, and fail."""
    names = {crdgen.SINGULAR, crdgen.PLURAL, *crdgen.SHORT_NAMES, s.SINGULAR, s.PLURAL, *s.SHORT_NAMES}
    assert not names & set(s.CATEGORIES)
