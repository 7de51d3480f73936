"""The chart, rendered by the real helm: lint, values scenarios, RBAC least privilege, security
defaults, schema refusals, CRD copy."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from helm_support import CHART, MONITORING_APIS, ROOT, template

CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


def kinds(docs):
    return [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, kinds(docs))
    return found[0]


def test_ci_values_files_exist():
    assert {p.name for p in CI_VALUES} >= {"default-values.yaml", "namespaced-values.yaml",
                                          "monitoring-values.yaml", "replicas-values.yaml"}


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_helm_lint_clean(helm, values):
    proc = subprocess.run([helm, "lint", "--strict", str(CHART), "-f", str(values)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_scenario_renders(helm, values):
    _, docs = template(helm, "-f", str(values), *MONITORING_APIS)
    assert one(docs, "Deployment")
    for d in docs:
        assert d["metadata"]["name"]
        assert "app.kubernetes.io/part-of" in d["metadata"]["labels"], d["kind"]


def all_rules(docs):
    """The operator's rules (the approver and retrier roles, for people, are tested in test_approvals_chart.py)."""
    return [(d["kind"], d["metadata"].get("namespace"), r) for d in docs if d["kind"] in ("Role", "ClusterRole")
            and d["metadata"]["name"] not in ("agentrun-approver", "agentrun-retrier") for r in d["rules"]]


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_rbac_least_privilege(helm, values):
    _, docs = template(helm, "-f", str(values), *MONITORING_APIS)
    rules = all_rules(docs)
    assert rules
    granted = set()
    for _, _, r in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in r[field], r
        for res in r["resources"]:
            assert res != "secrets", "the operator must never read Secrets"
            for v in r["verbs"]:
                granted.add((res, v))
    assert granted == {
        ("events", "create"),
        *{("agentruns", v) for v in ("list", "watch", "patch", "delete")},
        ("agentruns/status", "patch"),
        ("agentruns/status", "operate"),  # how the admission policy agentrun-status-owner knows the operator
        *{("agents", v) for v in ("list", "watch")},  # a run's spec.agentRef, resolved from the watch cache
        *{("jobs", v) for v in ("create", "list", "watch", "delete")},
        # the lap pods that exited 0 watched (controller/cache.py: a lap ends at its pod's exit); others read on demand
        *{("pods", v) for v in ("list", "watch")},
        ("workloads", "list"),  # the Workload of a lap Job Kueue holds (controller/kueueview.py), not watched
        # schedules (agentrun.schedule, docs/scheduling.md): watched, their status written, their runs created
        *{("agentschedules", v) for v in ("list", "watch")},
        ("agentschedules/status", "patch"),
        ("agentschedules/finalizers", "update"),  # blockOwnerDeletion of the runs' ownerReference
        ("agentruns", "create"),
        # no CRD list/watch: Kopf's scanning is disabled in every mode (rbac.crdWatch, deprecated, is off)
        *{("leases", v) for v in ("create", "get", "update", "patch")},
        # the tenancy re-check's watches (tenancy.operatorRecheck)
        *{("namespaces", v) for v in ("get", "list", "watch")},
        *{("validatingadmissionpolicybindings", v) for v in ("list", "watch")},
        *{("agentrunpolicies", v) for v in ("list", "watch")},
        # the admission policy check (controller/policycheck.py): its own policies, by name, listed and watched
        *{(res, v) for res in ("validatingadmissionpolicies", "validatingadmissionpolicybindings",
                               "mutatingadmissionpolicies", "mutatingadmissionpolicybindings") for v in ("list", "watch")},
    }
    admission_rules = [r for _, _, r in rules if "validatingadmissionpolicies" in r["resources"]
                       or "mutatingadmissionpolicies" in r["resources"]]
    assert admission_rules and all(r.get("resourceNames") and r["verbs"] == ["list", "watch"] for r in admission_rules)
    lease_rules = [r for _, ns, r in rules if "leases" in r["resources"]]
    assert all(ns == "agentrun-system" for _, ns, r in rules if "leases" in r["resources"])
    assert any(r.get("resourceNames") == ["agentrun-operator"] for r in lease_rules)


def test_every_rbac_rule_is_commented_framework_or_application():
    text = (CHART / "templates" / "rbac.yaml").read_text().splitlines()
    for i, line in enumerate(text):
        if line.strip().startswith("- apiGroups:"):
            comment = text[i - 1].strip()
            assert comment.startswith("# framework") or comment.startswith("# application"), (i, line)


def test_cluster_wide_vs_namespaced_rbac(helm):
    _, docs = template(helm)
    crds = {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]}
    assert crds not in one(docs, "ClusterRole", "agentrun-operator")["rules"]  # nothing watches CRDs
    assert one(docs, "ClusterRoleBinding", "agentrun-operator")["subjects"][0]["name"] == "agentrun-operator"
    assert [d["metadata"]["name"] for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")] == [
        "agentrun-approver", "agentrun-operator", "agentrun-operator-admission-reader", "agentrun-retrier",
        "agentrun-operator-tenancy-reader", "agentrun-operator", "agentrun-operator-admission-reader", "agentrun-operator-tenancy-reader"]
    _, docs = template(helm, "--set", "rbac.crdWatch=true")  # deprecated, still honoured
    assert crds in one(docs, "ClusterRole", "agentrun-operator")["rules"]
    _, docs = template(helm)
    assert not [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "agentrun-operator"]
    env = {e["name"]: e.get("value") for e in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AGENTRUN_NAMESPACES"] == ""

    _, docs = template(helm, "-f", str(CHART / "ci" / "namespaced-values.yaml"))
    roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "agentrun-operator"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "agentrun-operator"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    # nothing cluster-scoped but the read-only readers of cluster-scoped objects (the admission policy
    # check's gets by name, the tenancy re-check's watches), not even CRD read access (Kopf scanning is off)
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")) == [
        "agentrun-operator-admission-reader", "agentrun-operator-admission-reader",
        "agentrun-operator-tenancy-reader", "agentrun-operator-tenancy-reader"], kinds(docs)
    assert "customresourcedefinitions" not in yaml.safe_dump_all(docs)
    env = {e["name"]: e.get("value") for e in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AGENTRUN_NAMESPACES"] == "team-a,team-b"
    assert env["AGENTRUN_S3_CREDENTIALS_SECRET"] == "agentrun-s3"
    assert env["AGENTRUN_S3_PATH_STYLE"] == "true"


def test_lap_service_account_has_no_token_and_no_binding(helm):
    _, docs = template(helm, "-f", str(CHART / "ci" / "namespaced-values.yaml"))
    laps = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "agentrun-lap"]
    assert sorted(s["metadata"]["namespace"] for s in laps) == ["agentrun-system", "team-a", "team-b"]
    assert all(s["automountServiceAccountToken"] is False for s in laps)
    for b in docs:
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert all(s["name"] != "agentrun-lap" for s in b["subjects"]), b["metadata"]["name"]
    operator_sa = one(docs, "ServiceAccount", "agentrun-operator")
    assert operator_sa["metadata"]["namespace"] == "agentrun-system"


def test_deployment_security_and_env_names_match_the_operator_config(helm):
    _, docs = template(helm)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["agentrun", "operator"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] if "runAsNonRoot" in sc else pod["securityContext"]["runAsNonRoot"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    # liveness: Kopf's endpoint (controller/process.py LIVENESS_PATH); readiness: the metrics server's /readyz
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    env = {e["name"]: e for e in c["env"]}
    assert env["AGENTRUN_LOG_FORMAT"]["value"] == "json"
    # every AGENTRUN_* variable the chart sets is one the operator reads (controller/config.py)
    config_src = (ROOT / "operator" / "agentrun" / "controller" / "config.py").read_text()
    for name in env:
        assert f'"{name}"' in config_src, f"{name} is not read by controller/config.py"
    assert json.loads(env["AGENTRUN_LAP_REQUESTS"]["value"]) == {"cpu": "100m", "memory": "256Mi"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 9090, "liveness": 8081}  # /metrics and /readyz; Kopf's /healthz
    assert env["AGENTRUN_METRICS_PORT"]["value"] == "9090" and env["AGENTRUN_LIVENESS_PORT"]["value"] == "8081"
    svc = one(docs, "Service")
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"


def test_the_liveness_port_must_differ_from_the_metrics_port(helm):
    proc, _ = template(helm, "--set", "livenessPort=9090", check=False)
    assert proc.returncode != 0 and "livenessPort and metrics.port are both 9090" in proc.stderr, proc.stderr


def test_no_secret_values_in_rendered_chart(helm):
    _, docs = template(helm, "-f", str(CHART / "ci" / "namespaced-values.yaml"))
    assert not [d for d in docs if d["kind"] == "Secret"]
    for d in docs:
        if d["kind"] == "Deployment":
            for e in d["spec"]["template"]["spec"]["containers"][0]["env"]:
                assert "secretKeyRef" not in e.get("valueFrom", {}), e


def test_replicas_and_pdb(helm):
    _, docs = template(helm, "-f", str(CHART / "ci" / "replicas-values.yaml"))
    assert one(docs, "Deployment")["spec"]["replicas"] == 2
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_monitoring_off_by_default_and_on_with_values(helm):
    _, docs = template(helm, *MONITORING_APIS)
    assert not {"ServiceMonitor", "PrometheusRule", "ConfigMap"} & {d["kind"] for d in docs}
    _, docs = template(helm, "-f", str(CHART / "ci" / "monitoring-values.yaml"), *MONITORING_APIS)
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    rule = one(docs, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "0.9 * max by" in alerts["AgentRunBudgetNearlySpent"]["expr"]  # threshold from values
    assert 'up{job="agentrun-operator-metrics"}' in alerts["AgentRunOperatorDown"]["expr"]
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["agentrun.json"])["uid"] == "agentrun-overview"


def test_monitoring_on_without_the_crds_fails_clearly(helm):
    proc, _ = template(helm, "--set", "serviceMonitor.enabled=true", check=False)
    assert proc.returncode != 0 and "monitoring.coreos.com/v1 ServiceMonitor" in proc.stderr
    proc, _ = template(helm, "--set", "prometheusRule.enabled=true", check=False)
    assert proc.returncode != 0 and "monitoring.coreos.com/v1 PrometheusRule" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--set", "replicas=-1"], "/replicas"),
    (["--set", "logFormat=xml"], "/logFormat"),
    (["--set", "replicaCount=2"], "replicaCount"),
    (["--set", "watchNamespaces[0]=Bad_NS"], "/watchNamespaces/0"),
    # exact names only: Kopf globs/negations would need namespace scanning (cluster-scoped list)
    (["--set", "watchNamespaces[0]=team-*"], "/watchNamespaces/0"),
    (["--set", "watchNamespaces[0]=!kube-system"], "/watchNamespaces/0"),
    (["--set", "checkpoint.uri=http://not-s3"], "/checkpoint/uri"),
    (["--set", "prometheusRule.thresholds.costBudgetFraction=1.5"], "/prometheusRule/thresholds/costBudgetFraction"),
    (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
])
def test_schema_refuses_bad_values(helm, args, message):
    proc, _ = template(helm, *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_schema_is_valid_json_schema():
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, schema)


def test_chart_crd_is_the_generated_crd():
    """`make helm-crds` copies crds/ into the chart; they must be identical."""
    assert (CHART / "crds" / "agentrun.dev_agentruns.yaml").read_bytes() == \
        (ROOT / "crds" / "agentrun.dev_agentruns.yaml").read_bytes(), "run `make helm-crds`"


def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == "0.1.0"
