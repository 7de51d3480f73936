"""The lap Job builder and the operator configuration."""

from __future__ import annotations

import json

import pytest
from controller_world import UID, make_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import StoreLocation
from agentrun.controller.config import OperatorConfig
from agentrun.controller.decide.jobs import (
    ANNOTATION_APPROVAL,
    ApprovalEnv,
    RunIdentity,
    approval_annotation,
    build_job,
    effective_endpoint,
    job_name,
    label_value,
    resolve_store,
    store_of_env,
)

RUN = RunIdentity("ns", "run", UID)
CFG = OperatorConfig(checkpoint_uri="s3://bucket/prefix", s3_endpoint="http://127.0.0.1:9000",
                     s3_path_style=True, credentials_secret="s3-creds", job_ttl_seconds=60)


def _env(job: dict) -> dict:
    return {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_job_name_deterministic_and_bounded():
    assert job_name("run", UID, 3, 2) == "run-0f9e8-l3-a2"
    long = job_name("a" * 253, UID, 123456, 99)
    assert len(long) <= 63 and long.endswith("-0f9e8-l123456-a99") and long == job_name("a" * 253, UID, 123456, 99)
    assert job_name("a.b", UID, 1, 1) == "a-b-0f9e8-l1-a1"


def test_label_value_bounded():
    assert label_value("x") == "x"
    v = label_value("y" * 100)
    assert len(v) <= 63 and v != label_value("y" * 99)


def test_job_shape():
    job = build_job(RUN, make_spec(), 3, 2, "v7", CFG)
    meta, spec = job["metadata"], job["spec"]
    assert meta["name"] == "run-0f9e8-l3-a2"
    assert meta["labels"]["agentrun.dev/run"] == "run" and meta["labels"]["agentrun.dev/lap"] == "3"
    assert meta["labels"]["agentrun.dev/attempt"] == "2" and meta["labels"]["agentrun.dev/run-uid"] == UID
    (owner,) = meta["ownerReferences"]
    assert owner == {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "name": "run", "uid": UID,
                     "controller": True, "blockOwnerDeletion": True}
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 30 and spec["ttlSecondsAfterFinished"] == 60
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "agentrun-lap"
    (c,) = pod["containers"]
    assert c["command"] == ["agentrun", "lap"] and c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert c["terminationMessagePath"] == "/dev/termination-log"  # where the runner writes a failure's cause
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def test_env_per_contract_and_secrets_only_by_reference():
    spec = AgentRunSpec.model_validate({
        "task": "t",
        "agent": {
            "version": "v1",
            "model": {"provider": "openai", "name": "m", "apiKeySecretRef": {"name": "model-key", "key": "token"}},
            "tools": [{"name": "pay-out", "http": {"url": "http://x", "headersSecretRef": {"name": "hdr", "key": "h"}}}],
        },
        "resources": {"requests": {"cpu": "1"}},
    })
    job = build_job(RUN, spec, 1, 1, "v1", CFG, approval=ApprovalEnv("timed-out", "c9", "deadline", None))
    env = _env(job)
    assert env["AGENTRUN_LAP"]["value"] == "1" and env["AGENTRUN_ATTEMPT"]["value"] == "1"
    assert env["AGENTRUN_UID"]["value"] == UID and env["AGENTRUN_NAMESPACE"]["value"] == "ns"
    assert env["AGENTRUN_CHECKPOINT_URI"]["value"] == "s3://bucket/prefix"
    assert env["AGENTRUN_S3_ENDPOINT"]["value"] == "http://127.0.0.1:9000"
    assert env["AGENTRUN_S3_PATH_STYLE"]["value"] == "true"
    assert env["AGENTRUN_AGENT_VERSION"]["value"] == "v1"
    assert AgentRunSpec.model_validate(json.loads(env["AGENTRUN_SPEC"]["value"])) == spec
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}
    assert env["AGENTRUN_MODEL_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "model-key", "key": "token"}
    assert env["AGENTRUN_TOOL_HEADERS_PAY_OUT"]["valueFrom"]["secretKeyRef"] == {"name": "hdr", "key": "h"}
    assert env["AGENTRUN_APPROVAL_DECISION"]["value"] == "timed-out" and env["AGENTRUN_APPROVAL_CALL_ID"]["value"] == "c9"
    assert "AGENTRUN_APPROVAL_BY" not in env
    for e in env.values():
        assert "value" in e or set(e["valueFrom"]) == {"secretKeyRef"}
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"] == {"requests": {"cpu": "1"}}


def test_spec_checkpoint_overrides_operator_defaults():
    spec = make_spec(checkpoint={"uri": "s3://other/p", "pathStyle": False, "credentialsSecretName": "mine"})
    env = _env(build_job(RUN, spec, 1, 1, "v1", CFG))
    assert env["AGENTRUN_CHECKPOINT_URI"]["value"] == "s3://other/p"
    assert env["AGENTRUN_S3_PATH_STYLE"]["value"] == "false"
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "mine"
    assert env["AGENTRUN_S3_CREDENTIALS_SECRET"] == {"name": "AGENTRUN_S3_CREDENTIALS_SECRET", "value": "mine"}


def test_missing_checkpoint_uri_names_the_field():
    with pytest.raises(ValueError, match="spec.checkpoint.uri"):
        build_job(RUN, make_spec(), 1, 1, "v1", OperatorConfig())


def test_config_from_env():
    cfg = OperatorConfig.from_env({
        "AGENTRUN_CHECKPOINT_URI": "s3://b/p", "AGENTRUN_JOB_TTL_SECONDS": "-1", "AGENTRUN_NAMESPACES": "a, b",
        "AGENTRUN_LAP_REQUESTS": '{"cpu": "50m"}', "AGENTRUN_S3_PATH_STYLE": "true", "AGENTRUN_IDENTITY": "me",
    })
    assert cfg.checkpoint_uri == "s3://b/p" and cfg.job_ttl_seconds is None and cfg.namespaces == ("a", "b")
    assert cfg.default_requests == {"cpu": "50m"} and cfg.s3_path_style and cfg.identity == "me"


@pytest.mark.parametrize("env,on", [
    ({}, True),
    ({"AGENTRUN_TENANCY_RECHECK": "false"}, False),
    ({"AGENTRUN_TENANCY_RECHECK": "true"}, True),
])
def test_the_tenancy_recheck_is_a_switch(env, on):
    assert OperatorConfig.from_env(env).tenancy_recheck is on


@pytest.mark.parametrize("var,value", [("AGENTRUN_METRICS_PORT", "x"), ("AGENTRUN_LAP_REQUESTS", "[1]"),
                                       ("AGENTRUN_TENANCY_RECHECK", "sometimes"),
                                       ("AGENTRUN_S3_PATH_STYLE", "maybe"), ("AGENTRUN_LOG_FORMAT", "xml"),
                                       ("AGENTRUN_WATCH_TIMEOUT_SECONDS", "0"),
                                       ("AGENTRUN_WATCH_TIMEOUT_SECONDS", "3600"),
                                       ("AGENTRUN_WATCH_TIMEOUT_SECONDS", "2m"), ("AGENTRUN_EVENT_LOOP", "tokio")])
def test_config_errors_name_the_variable(var, value):
    with pytest.raises(ValueError, match=var):
        OperatorConfig.from_env({var: value})


def test_the_watch_timeout_reaches_every_informer_query():
    """AGENTRUN_WATCH_TIMEOUT_SECONDS is what the API server is asked for (timeoutSeconds), and
    the client's read timeout stays 30 s above it."""
    import asyncio

    from agentrun.kube.client import JOBS
    from agentrun.kube.informer import WATCH_READ_MARGIN_SECONDS, WATCH_SECONDS, Informer

    assert OperatorConfig.from_env({}).watch_timeout_seconds == WATCH_SECONDS
    cfg = OperatorConfig.from_env({"AGENTRUN_WATCH_TIMEOUT_SECONDS": "7"})
    loop = asyncio.new_event_loop()
    try:
        inf = Informer(None, "jobs", "team-a", None, None, loop, resource=JOBS,  # type: ignore[arg-type]
                       watch_seconds=cfg.watch_timeout_seconds)
        assert inf._watch_query("42")["timeoutSeconds"] == 7
        assert inf.watch_seconds + WATCH_READ_MARGIN_SECONDS == 37
    finally:
        loop.close()


def test_job_carries_the_decision_it_executes():
    approval = ApprovalEnv("approved", "c1", "ok", "alice", arguments_sha256="ab" * 32)
    job = build_job(RUN, make_spec(), 3, 1, "v1", CFG, approval=approval)
    ann = job["metadata"]["annotations"][ANNOTATION_APPROVAL]
    assert json.loads(ann) == {"decision": "approved", "callId": "c1", "argumentsSha256": "ab" * 32}
    assert ann == approval_annotation(approval)
    assert build_job(RUN, make_spec(), 1, 1, "v1", CFG)["metadata"]["annotations"][ANNOTATION_APPROVAL] == "none"


def test_job_uses_the_pinned_store_not_the_current_defaults():
    pinned = StoreLocation(uri="s3://pinned/p", endpoint="http://old:9000", region="eu-west-1", path_style=False)
    job = build_job(RUN, make_spec(), 2, 1, "v1", CFG, store=pinned)
    env = _env(job)
    assert env["AGENTRUN_CHECKPOINT_URI"]["value"] == "s3://pinned/p"
    assert env["AGENTRUN_S3_ENDPOINT"]["value"] == "http://old:9000"
    assert env["AGENTRUN_S3_REGION"]["value"] == "eu-west-1" and env["AGENTRUN_S3_PATH_STYLE"]["value"] == "false"
    assert store_of_env(job["spec"]["template"]["spec"]["containers"][0]["env"]) == pinned


def test_resolve_store_from_spec_and_defaults():
    assert resolve_store(make_spec(), CFG) == StoreLocation(uri="s3://bucket/prefix", endpoint="http://127.0.0.1:9000",
                                                            path_style=True)
    spec = make_spec(checkpoint={"uri": "s3://other/p", "pathStyle": False, "region": "r1"})
    assert resolve_store(spec, CFG) == StoreLocation(uri="s3://other/p", endpoint="http://127.0.0.1:9000",
                                                     region="r1", path_style=False)
    with pytest.raises(ValueError, match="spec.checkpoint.uri"):
        resolve_store(make_spec(), OperatorConfig())


def test_credentials_in_an_endpoint_never_reach_status_but_are_still_used():
    cfg = OperatorConfig(checkpoint_uri="s3://b/p", s3_endpoint="http://user:pw@minio:9000")
    pinned = resolve_store(make_spec(), cfg)
    assert pinned.endpoint == "http://minio:9000"
    assert effective_endpoint(pinned, make_spec(), cfg) == "http://user:pw@minio:9000"
    moved = pinned.model_copy(update={"endpoint": "http://elsewhere:9000"})
    assert effective_endpoint(moved, make_spec(), cfg) == "http://elsewhere:9000"


# ------------------------------------------------------------------ spec.agent.podTemplate (issue 33)

def _with_template(tpl: dict) -> AgentRunSpec:
    agent = {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "x"}]}, "podTemplate": tpl}
    return make_spec(agent=agent)


FULL_TEMPLATE = {
    "labels": {"team": "payments", "example.com/cost-center": "cc-7"},
    "annotations": {"example.com/owner": "ops@example.com"},
    "nodeSelector": {"pool": "agents", "kubernetes.io/arch": "amd64"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoSchedule"},
                    {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}},
    "priorityClassName": "agents-low",
    "runtimeClassName": "gvisor",
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"team": "payments"}}}],
}


def test_the_pod_template_passes_through_to_the_lap_pod_and_not_to_the_job():
    job = build_job(RUN, _with_template(FULL_TEMPLATE), 3, 2, "v7", CFG)
    meta, pod = job["spec"]["template"]["metadata"], job["spec"]["template"]["spec"]
    assert meta["labels"]["team"] == "payments" and meta["labels"]["example.com/cost-center"] == "cc-7"
    assert meta["labels"]["agentrun.dev/run"] == "run" and meta["labels"]["agentrun.dev/lap"] == "3"
    assert meta["annotations"] == {"example.com/owner": "ops@example.com", "agentrun.dev/agent-version": "v7"}
    assert pod["nodeSelector"] == FULL_TEMPLATE["nodeSelector"]
    assert pod["tolerations"] == FULL_TEMPLATE["tolerations"]
    assert pod["affinity"] == FULL_TEMPLATE["affinity"]
    assert pod["priorityClassName"] == "agents-low" and pod["runtimeClassName"] == "gvisor"
    (tsc,) = pod["topologySpreadConstraints"]
    assert tsc["maxSkew"] == 1 and tsc["labelSelector"]["matchLabels"] == {"team": "payments"}
    # what the operator sets is untouched
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    # the Job object itself carries only the operator's labels
    assert "team" not in job["metadata"]["labels"]


def test_without_a_pod_template_the_pod_has_no_scheduling_fields():
    pod = build_job(RUN, make_spec(), 1, 1, "v1", CFG)["spec"]["template"]["spec"]
    for f in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "runtimeClassName",
              "topologySpreadConstraints"):
        assert f not in pod
    empty, plain = (build_job(RUN, s, 1, 1, "v1", CFG)["spec"]["template"] for s in (_with_template({}), make_spec()))
    for t in (empty, plain):
        t["spec"]["containers"][0].pop("env")  # AGENTRUN_SPEC holds the spec as written
    assert empty == plain


def test_every_label_and_annotation_the_operator_sets_on_the_pod_is_refused_in_a_template():
    """The contract between build_job and the models: a template can never name a key the operator sets
    (so the operator's labels, by which it and the CLI find lap pods, cannot be overridden)."""
    import pydantic

    meta = build_job(RUN, make_spec(), 1, 1, "v1", CFG, approval=ApprovalEnv("approved", "c1"))
    keys = {"labels": set(meta["spec"]["template"]["metadata"]["labels"]) | set(meta["metadata"]["labels"]),
            "annotations": set(meta["spec"]["template"]["metadata"]["annotations"])
            | set(meta["metadata"]["annotations"])}
    for what, names in keys.items():
        for key in names:
            with pytest.raises(pydantic.ValidationError, match=f"podTemplate.{what}"):
                _with_template({what: {key: "x"}})


def test_the_operators_labels_win_over_a_template_even_past_the_models():
    """Defence in depth: a template built without validation (model_construct) cannot override them."""
    from agentrun.api.spec import LapPodTemplate

    spec = make_spec()
    evil = LapPodTemplate.model_construct(labels={"agentrun.dev/run": "other", "agentrun.dev/run-uid": "x"},
                                          annotations={"agentrun.dev/agent-version": "v0"})
    spec = spec.model_copy(update={"agent": spec.agent.model_copy(update={"pod_template": evil})})
    tmeta = build_job(RUN, spec, 1, 1, "v9", CFG)["spec"]["template"]["metadata"]
    assert tmeta["labels"]["agentrun.dev/run"] == "run" and tmeta["labels"]["agentrun.dev/run-uid"] == UID
    assert tmeta["annotations"]["agentrun.dev/agent-version"] == "v9"


_LABEL_NAME = st.from_regex(r"[a-z0-9]([-a-z0-9_.]{0,10}[a-z0-9])?", fullmatch=True)
_LABEL_VALUE = st.from_regex(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,8}[A-Za-z0-9])?)?", fullmatch=True)
_DNS_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?", fullmatch=True)
_USER_KEY = st.one_of(_LABEL_NAME, st.builds(lambda p, n: f"{p}.example.com/{n}", _DNS_LABEL, _LABEL_NAME)).filter(
    lambda k: k not in ("job-name", "controller-uid"))
_TOLERATION = st.one_of(
    st.builds(lambda k, v, e: {"key": k, "operator": "Equal", "value": v, "effect": e}, _LABEL_NAME, _LABEL_VALUE,
              st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])),
    st.builds(lambda s: {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": s},
              st.integers(0, 3600)))
_TEMPLATE = st.fixed_dictionaries({}, optional={
    "labels": st.dictionaries(_USER_KEY, _LABEL_VALUE, max_size=5),
    "annotations": st.dictionaries(_USER_KEY, st.text(max_size=20), max_size=5),
    "nodeSelector": st.dictionaries(_USER_KEY, _LABEL_VALUE, max_size=4),
    "tolerations": st.lists(_TOLERATION, max_size=3),
    "priorityClassName": _DNS_LABEL,
    "runtimeClassName": _DNS_LABEL,
})


@settings(max_examples=150, deadline=None)
@given(tpl=_TEMPLATE, lap=st.integers(1, 50), attempt=st.integers(1, 5))
def test_any_template_reaches_the_pod_exactly_and_leaves_the_operators_settings_alone(tpl, lap, attempt):
    job = build_job(RUN, _with_template(tpl), lap, attempt, "v1", CFG)
    plain = build_job(RUN, make_spec(), lap, attempt, "v1", CFG)
    meta, pod = job["spec"]["template"]["metadata"], job["spec"]["template"]["spec"]
    pmeta, ppod = plain["spec"]["template"]["metadata"], plain["spec"]["template"]["spec"]
    assert meta["labels"] == {**tpl.get("labels", {}), **pmeta["labels"]}
    assert meta["annotations"] == {**tpl.get("annotations", {}), **pmeta["annotations"]}
    scheduling = {k: v for k, v in pod.items() if k not in ppod}
    want = {k: v for k, v in tpl.items() if k not in ("labels", "annotations") and v not in ({}, [])}
    assert scheduling == want
    for p in (pod, ppod):
        p["containers"][0].pop("env")  # AGENTRUN_SPEC holds the spec as written
    assert {k: v for k, v in pod.items() if k in ppod} == ppod  # nothing of the operator's changed
    assert job["metadata"] == plain["metadata"]


def test_the_decision_time_goes_to_the_lap_that_applies_it_for_the_approval_span():
    """status.approval.decidedAt -> AGENTRUN_APPROVAL_DECIDED_AT -> the lap's ApprovalDecision.decided_at,
    where its span of the approval wait ends (lap/tracing)."""
    from datetime import UTC, datetime

    from agentrun.api.contract import Env
    from agentrun.api.status import AgentRunStatus
    from agentrun.controller.decide.approvals import approval_env
    from agentrun.lap.config import parse_decision

    at = datetime(2031, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    status = AgentRunStatus.model_validate({"phase": "Pending", "lap": 1, "approval": {
        "state": "Approved", "lap": 1, "tool": "pay", "callId": "c1", "decision": "approved",
        "decidedBy": "alice", "decidedAt": at.isoformat(), "requestedAt": "2031-03-04T05:00:00Z",
        "owner": "team", "deadline": "2031-03-05T05:00:00Z", "idempotencyKey": "k"}})
    approval = approval_env(status)
    assert approval is not None and approval.decided_at == at
    env = {k: v["value"] for k, v in _env(build_job(RUN, make_spec(), 2, 1, "v1", CFG, approval=approval)).items()
           if "value" in v}
    assert env[Env.APPROVAL_DECIDED_AT] == at.isoformat()
    decision = parse_decision(env)
    assert decision is not None and decision.decided_at == at and decision.decided_by == "alice"
    for bad in ("yesterday", "2031-03-04T05:06:07"):  # unparsable or without a zone: ignored, not a failed lap
        assert parse_decision({**env, Env.APPROVAL_DECIDED_AT: bad}).decided_at is None  # type: ignore[union-attr]
    assert Env.APPROVAL_DECIDED_AT not in _env(build_job(RUN, make_spec(), 2, 1, "v1", CFG, approval=ApprovalEnv(
        "approved", "c1")))
