"""The Agent resource's pure parts (api/agent.py): parameter checks, the task template, the
resolved copy and its digest, the run's overrides, the effective spec; and the Agent CRD."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agentrun.api import crdgen
from agentrun.api.agent import (
    AgentDefinitionSpec,
    ResolveError,
    check_parameters,
    coerce,
    effective_spec,
    render_task,
    resolve,
)
from agentrun.api.reasons import Reason
from agentrun.api.spec import AgentRunManifestSpec

ROOT = Path(__file__).resolve().parents[2]


def definition(**over: Any) -> AgentDefinitionSpec:
    doc: dict[str, Any] = {
        "version": "v1",
        "model": {"provider": "scripted", "script": [{"content": "done"}]},
        "parameters": [
            {"name": "topic", "required": True, "description": "what to research"},
            {"name": "depth", "type": "integer", "default": "2"},
            {"name": "strict", "type": "boolean"},
        ],
        "budget": {"maxLaps": 7},
        "approval": {"owner": "team-a", "timeout": "1h"},
    }
    doc.update(over)
    return AgentDefinitionSpec.model_validate(doc)


def run(**over: Any) -> AgentRunManifestSpec:
    doc: dict[str, Any] = {"task": "Research {{ topic }} to depth {{depth}}.", "agentRef": {"name": "researcher"},
                           "parameters": {"topic": "CRDs"}}
    doc.update(over)
    return AgentRunManifestSpec.model_validate(doc)


# -- parameters -----------------------------------------------------------------------------------


def test_parameters_typed_and_defaulted() -> None:
    typed, text = check_parameters("researcher", definition().parameters, {"topic": "x", "strict": "true"})
    assert typed == {"topic": "x", "depth": 2, "strict": True}
    assert text == {"topic": "x", "depth": "2", "strict": "true"}


@pytest.mark.parametrize(("given_", "field", "words"), [
    ({}, "spec.parameters.topic", "required by Agent researcher and not set"),
    ({"topic": "x", "depth": "two"}, "spec.parameters.depth", "is not an integer"),
    ({"topic": "x", "strict": "yes"}, "spec.parameters.strict", "is not a boolean"),
    ({"topic": "x", "colour": "red"}, "spec.parameters.colour", "not declared by Agent researcher"),
])
def test_bad_parameters_are_refused_naming_the_field(given_: dict[str, str], field: str, words: str) -> None:
    with pytest.raises(ResolveError) as err:
        check_parameters("researcher", definition().parameters, given_)
    assert err.value.problem.reason == Reason.INVALID_PARAMETERS
    assert err.value.problem.message.startswith(field + ":") and words in err.value.problem.message


@given(st.integers(min_value=-(10**17), max_value=10**17))
def test_integers_round_trip(n: int) -> None:
    assert coerce("integer", str(n)) == n


@given(st.text(max_size=30))
def test_coerce_accepts_only_its_type(raw: str) -> None:
    for t in ("integer", "number", "boolean"):
        try:
            v = coerce(t, raw)
        except ValueError as exc:
            assert "is not a" in str(exc)
            continue
        if t == "integer":
            assert isinstance(v, int) and re.fullmatch(r"[-+]?[0-9]+", raw)
        elif t == "boolean":
            assert raw in ("true", "false")
        else:
            assert isinstance(v, float)
    assert coerce("string", raw) == raw


def test_a_default_must_be_of_its_type() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"spec.parameters\[n\].default"):
        definition(parameters=[{"name": "n", "type": "integer", "default": "many"}])


# -- the template ---------------------------------------------------------------------------------


def test_render_replaces_placeholders_and_escapes() -> None:
    assert render_task("a {{x}} b {{  x  }} \\{{x}} c", {"x": "1"}) == "a 1 b 1 {{x}} c"


@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True), st.text(max_size=20), max_size=4))
def test_values_are_inserted_verbatim_and_never_rendered_again(values: dict[str, str]) -> None:
    template = " | ".join(f"{{{{ {k} }}}}" for k in values)
    out = render_task(template, values)
    assert out == " | ".join(values.values())


@given(st.text(alphabet="{}\\ ax", max_size=30))
def test_render_either_renders_or_names_spec_task(template: str) -> None:
    try:
        out = render_task(template, {"a": "V"})
    except ValueError as exc:
        assert str(exc).startswith("spec.task:")
    else:  # every unescaped {{ was a placeholder: none is left once the escapes are gone
        assert "{{" not in render_task(template.replace("\\{{", ""), {"a": "V"}), out


@pytest.mark.parametrize(("template", "words"), [
    ("{{ nope }}", "names no declared parameter"),
    ("{{ strict }}", "has no value"),
    ("open {{ and never closed", "opens no {{ name }} placeholder"),
    ("{{ a.b }}", "opens no {{ name }} placeholder"),
])
def test_bad_templates_name_spec_task(template: str, words: str) -> None:
    with pytest.raises(ResolveError) as err:
        resolve("researcher", definition(), run(task=template))
    assert err.value.problem.message.startswith("spec.task:") and words in err.value.problem.message


# -- the resolved copy, overrides, the effective spec ----------------------------------------------


def test_resolve_renders_and_digests_deterministically() -> None:
    a = resolve("researcher", definition(), run())
    b = resolve("researcher", definition(), run())
    assert a.task == "Research CRDs to depth 2."
    assert a.parameters == {"topic": "CRDs", "depth": 2}
    assert a.digest() == b.digest() and re.fullmatch(r"[0-9a-f]{64}", a.digest())
    changed = resolve("researcher", definition(version="v2"), run())
    assert changed.digest() != a.digest() and changed.version == "v2"


def test_the_runs_set_fields_win_field_by_field() -> None:
    r = resolve("researcher", definition(), run(budget={"maxCostUSD": "1.00"}, approval={"approvers": 2}))
    assert r.budget.max_laps == 7 and r.budget.max_cost_usd == "1.00"  # the Agent's maxLaps stays
    assert r.approval.owner == "team-a" and r.approval.timeout == "1h" and r.approval.approvers == 2
    assert r.retry.attempts_per_lap == 3  # neither sets it: the default
    unset = resolve("researcher", definition(), run())
    assert unset.budget.max_laps == 7 and unset.approval.approvers == 1


def test_merged_policies_are_validated_again() -> None:
    d = definition(retry={"backoff": {"initial": "10s", "max": "20s"}})
    with pytest.raises(ResolveError, match="backoff"):
        resolve("researcher", d, run(retry={"backoff": {"initial": "1m"}}))


def test_effective_spec_is_an_inline_spec() -> None:
    m = run(suspend=True, checkpoint={"uri": "s3://bucket/p"})
    eff = effective_spec(m, resolve("researcher", definition(), m))
    assert eff.agent.version == "v1" and eff.task == "Research CRDs to depth 2."
    assert eff.suspend is True and eff.checkpoint.uri == "s3://bucket/p" and eff.budget.max_laps == 7
    assert "agentRef" not in eff.to_api() and "parameters" not in eff.to_api()


def test_manifest_needs_exactly_one_agent() -> None:
    agent = {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}]}}
    with pytest.raises(pydantic.ValidationError, match="exactly one must be set"):
        AgentRunManifestSpec.model_validate({"task": "t", "agent": agent, "agentRef": {"name": "a"}})
    with pytest.raises(pydantic.ValidationError, match="exactly one must be set"):
        AgentRunManifestSpec.model_validate({"task": "t"})
    with pytest.raises(pydantic.ValidationError, match="spec.parameters needs spec.agentRef"):
        AgentRunManifestSpec.model_validate({"task": "t", "agent": agent, "parameters": {"a": "b"}})
    inline = AgentRunManifestSpec.model_validate({"task": "{{ kept }}", "agent": agent})
    assert inline.task == "{{ kept }}"  # an inline run's task is used as written
    with pytest.raises(pydantic.ValidationError, match="spec.task is required with an inline spec.agent"):
        AgentRunManifestSpec.model_validate({"agent": agent})


# -- the CRD --------------------------------------------------------------------------------------


def test_agent_crd_is_committed_and_documented() -> None:
    assert (ROOT / "crds" / "agentrun.dev_agents.yaml").read_text() == crdgen.render_agent_crd(), "run `make crds`"
    assert (ROOT / "helm" / "agentrun-operator" / "crds" / "agentrun.dev_agents.yaml").read_text() == \
        crdgen.render_agent_crd(), "run `make helm-crds`"
    schema = crdgen.agent_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert crdgen.undocumented_fields(schema) == []
    columns = [c["name"] for c in crdgen.agent_crd()["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:4] == ["Version", "Model", "Rollout", "Age"]
    spec = schema["properties"]["spec"]
    assert spec["properties"]["rollout"]["enum"] == ["Pinned", "FollowLatest"]
    assert "parameters" in spec["properties"] and "budget" in spec["properties"]
    yaml.safe_load(crdgen.render_agent_crd())


def test_run_crd_rules_for_agent_ref() -> None:
    rules = [r["message"] for r in crdgen.CEL_RULES["spec"]]
    assert any(m.startswith("spec.agent, spec.agentRef: exactly one") for m in rules)
    assert any(m.startswith("spec.agentRef is immutable") for m in rules)
    assert any(m.startswith("spec.parameters needs spec.agentRef") for m in rules)
