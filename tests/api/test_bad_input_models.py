"""The bad-input table (tests/fixtures/bad-input/agentruns.yaml) against the pydantic models: the
operator and the lap runner parse the spec with them, so they refuse what the CRD refuses, naming
the same field. The API server side of the same table is tests/e2e/test_bad_input.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pydantic
import pytest

from agentrun.api.spec import AgentRunSpec, BackoffSpec, ResourcesSpec, SecretKeyRef

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "bad-input"))
import bad_input_table as table  # noqa: E402

MODEL_CASES = [c for c in table.cases() if c.get("op", "create") == "create" and c.get("models") != "accepts"]


def _path(loc: tuple) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def test_the_base_manifest_is_valid_for_the_models():
    AgentRunSpec.model_validate(table.base()["spec"])


@pytest.mark.parametrize("case", MODEL_CASES, ids=[c["name"] for c in MODEL_CASES])
def test_models_refuse_the_case_naming_the_field(case):
    with pytest.raises(pydantic.ValidationError) as err:
        AgentRunSpec.model_validate(table.case_manifest(case)["spec"])
    field = case["expect"][0].removeprefix('unknown field "').rstrip('"')
    paths = [_path(e["loc"]) for e in err.value.errors()]
    assert any(p == field or p.startswith(field) or field.startswith(p + ".") for p in paths) or field in str(err.value), (
        field, paths, str(err.value))


@pytest.mark.parametrize("value,ok", [("100m", True), ("0.5", True), ("256Mi", True), ("1G", True), ("1e3", True),
                                      ("a lot", False), ("256MB", False), ("-1", False), ("", False)])
def test_resource_quantities(value, ok):
    if ok:
        ResourcesSpec.model_validate({"requests": {"cpu": value}, "limits": {"memory": value}})
    else:
        with pytest.raises(pydantic.ValidationError, match="requests.cpu"):
            ResourcesSpec.model_validate({"requests": {"cpu": value}})


@pytest.mark.parametrize("key,ok", [("api-key", True), ("OPENAI_API_KEY", True), ("tls.crt", True),
                                    ("keys/api", False), ("two words", False)])
def test_secret_keys_are_what_a_secret_can_hold(key, ok):
    if ok:
        SecretKeyRef(name="openai", key=key)
    else:
        with pytest.raises(pydantic.ValidationError, match="key"):
            SecretKeyRef(name="openai", key=key)


def test_backoff_max_below_initial_is_refused_naming_both_fields():
    assert BackoffSpec(initial="10s", max="10s").max == "10s"
    with pytest.raises(pydantic.ValidationError, match=r"spec.retry.backoff.max must not be shorter than spec.retry.backoff.initial"):
        BackoffSpec(initial="5m", max="10s")
