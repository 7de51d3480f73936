"""The lap pod template (``spec.agent.podTemplate``, issue 33) on the real local control plane.

* A run whose podTemplate names a RuntimeClass (created first: the API server's RuntimeClass
  admission refuses a pod naming one that does not exist), a nodeSelector on the local node's
  labels, a label, an annotation and a toleration: its lap Pod, read from the API server, carries
  them beside the operator's labels, and the run Succeeds.
* A team AgentRunPolicy bound to the namespace (``agentrun.dev/tenancy-policy``) that allows only
  that runtime class: an inline run asking for another is refused at ``kubectl apply`` with the
  checker's exact message, naming ``spec.agent.podTemplate.runtimeClassName``; a run of an Agent
  asking for it (the admission policy cannot see the Agent) is admitted and stopped by the
  operator's re-check before any lap, with the same message (reason PolicyViolation).

What the local control plane cannot show: the process kubelet (e2e/proc_kubelet.py) is the
scheduler and binds every pod to its one node without reading nodeSelector, tolerations, affinity
or priority, and runs the container as a host process whatever the RuntimeClass. So this test
proves what reaches the API server (the Pod object, admitted with its RuntimeClass), and asserts
that the node the pod was bound to has the selected labels; it does not prove that a real
scheduler would place the pod there.
"""

from __future__ import annotations

import json
import uuid

import pytest
import yaml
from e2e_support import delete_team_policy, wait_for
from test_operator_e2e import _diagnostics_on_failure, env  # noqa: F401

from agentrun.api import tenancy as t
from agentrun.api import tenancy_admission as ta

pytestmark = [pytest.mark.e2e]

API = "agentrun.dev/v1alpha1"


@pytest.fixture(scope="module")
def classes(env):  # noqa: F811
    """(allowed RuntimeClass, another RuntimeClass, team policy name), the policy bound to env.ns; the
    default binding (the local policy, which allows any pod template) still applies too."""
    suffix = uuid.uuid4().hex[:6]
    allowed, other, pname = f"sandboxed-{suffix}", f"other-{suffix}", f"pods-{suffix}"
    for name in (allowed, other):
        env.kubectl("apply", "-f", "-", input=yaml.safe_dump(
            {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": "runc"}))
    spec = ta.LOCAL_POLICY.model_copy(update={"pod_template": t.PodTemplatePolicy(
        allowed_runtime_class_names=[allowed])})
    sel = {"matchLabels": {t.NAMESPACE_LABEL: pname}}
    env.kubectl("apply", "-f", "-", input="".join("---\n" + yaml.safe_dump(d) for d in (
        ta.policy_object(pname, spec), ta.binding(f"{t.VAP_NAME}-{pname}", pname, sel))))
    env.kubectl("label", "namespace", env.ns, f"{t.NAMESPACE_LABEL}={pname}")
    yield allowed, other, pname, spec
    env.kubectl("label", "namespace", env.ns, f"{t.NAMESPACE_LABEL}-", check=False)
    delete_team_policy(env.cluster, pname)
    for name in (allowed, other):
        env.kubectl("delete", "runtimeclass", name, "--ignore-not-found", check=False)


def _node(env) -> dict:  # noqa: F811
    (node,) = json.loads(env.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return node


def test_the_lap_pod_carries_the_template_and_the_run_succeeds(env, classes):  # noqa: F811
    allowed = classes[0]
    node = _node(env)
    selector = {"kubernetes.io/hostname": node["metadata"]["labels"]["kubernetes.io/hostname"]}
    toleration = {"key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoSchedule"}
    doc = env.run_doc("podtpl", [{"content": "done"}])
    doc["spec"]["agent"]["podTemplate"] = {
        "labels": {"team": "payments"}, "annotations": {"example.com/owner": "ops"},
        "runtimeClassName": allowed, "nodeSelector": selector, "tolerations": [toleration]}
    env.apply(doc)
    st = env.wait_phase("podtpl", "Succeeded", "Failed", timeout=60)
    assert st["phase"] == "Succeeded", st
    (pod,) = json.loads(env.kubectl("get", "pods", "-n", env.ns, "-l", "agentrun.dev/run=podtpl",
                                    "-o", "json").stdout)["items"]
    labels, spec = pod["metadata"]["labels"], pod["spec"]
    assert labels["team"] == "payments" and labels["agentrun.dev/run"] == "podtpl", labels
    assert labels["agentrun.dev/lap"] == "1" and labels["app.kubernetes.io/managed-by"] == "agentrun", labels
    assert pod["metadata"]["annotations"]["example.com/owner"] == "ops"
    assert spec["runtimeClassName"] == allowed and spec["nodeSelector"] == selector
    assert toleration in spec["tolerations"], spec["tolerations"]
    # the process kubelet binds without reading nodeSelector: check the node it chose has the labels
    assert spec["nodeName"] == node["metadata"]["name"]
    assert all(node["metadata"]["labels"].get(k) == v for k, v in selector.items())


def test_a_team_policy_refuses_another_runtime_class_at_apply_and_for_a_run_of_an_agent(env, classes):  # noqa: F811
    _, other, pname, policy = classes
    doc = env.run_doc("podtpl-other", [{"content": "done"}])
    doc["spec"]["agent"]["podTemplate"] = {"runtimeClassName": other}
    violations = t.check(doc["spec"], policy)
    want = t.refusal(pname, violations)
    assert [v.field for v in violations] == ["spec.agent.podTemplate.runtimeClassName"]
    # the binding is in force once a dry run is refused (a binding takes a moment to reach admission)
    wait_for("the team binding in force", lambda: env.kubectl(
        "apply", "-n", env.ns, "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False).returncode != 0,
        timeout=60, interval=1)
    r = env.apply(doc, check=False)
    assert r.returncode != 0 and want in r.stderr, r.stderr
    assert "spec.agent.podTemplate.runtimeClassName" in r.stderr and env.get("podtpl-other") == {}

    # a run of an Agent: admitted (the policy sees only spec.agentRef), stopped by the operator's re-check
    agent = {"apiVersion": API, "kind": "Agent", "metadata": {"name": "podtpl-agent"}, "spec": {
        "version": "v1", "task": "say done", "model": {"provider": "scripted", "script": [{"content": "done"}]},
        "podTemplate": {"runtimeClassName": other}}}
    env.apply(agent)
    env.apply({"apiVersion": API, "kind": "AgentRun", "metadata": {"name": "podtpl-of-agent"},
               "spec": {"agentRef": {"name": "podtpl-agent"}, "lapTimeout": "60s"}})
    st = env.wait_phase("podtpl-of-agent", "Failed", "Succeeded", timeout=60)
    assert st["phase"] == "Failed", st
    cond = next(c for c in st.get("conditions") or [] if c.get("reason") == t.CONDITION_REASON)
    assert violations[0].message in cond["message"], cond
    assert env.jobs("podtpl-of-agent") == []  # refused before its first lap's Job
