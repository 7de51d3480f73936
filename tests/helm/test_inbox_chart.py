"""The approval inbox in the chart (docs/inbox.md), rendered by the real helm: off by default; on,
its own Deployment/Service/ServiceAccount, a ClusterRole that may only impersonate (and create
TokenReviews in token mode), the session key from a Secret, and values refused by the schema."""
from __future__ import annotations

import pytest
from helm_support import template

ON = ["--set", "inbox.enabled=true"]


def _inbox(docs):
    return [d for d in docs if d["metadata"]["name"].endswith("-inbox") or d["metadata"]["name"].endswith("-inbox-session")]


def _one(docs, kind):
    found = [d for d in _inbox(docs) if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in _inbox(docs)]
    return found[0]


def _env(dep):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_off_by_default(helm):
    _, docs = template(helm)
    assert _inbox(docs) == []


def test_token_mode_may_only_impersonate_and_review_tokens(helm):
    _, docs = template(helm, *ON)
    assert sorted(d["kind"] for d in _inbox(docs)) == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "Secret", "Service", "ServiceAccount"]
    role = _one(docs, "ClusterRole")
    rules = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
             for v in rule["verbs"]}
    assert rules == {("", "users", "impersonate"), ("", "groups", "impersonate"), ("", "serviceaccounts", "impersonate"),
                     ("authentication.k8s.io", "tokenreviews", "create")}
    binding = _one(docs, "ClusterRoleBinding")
    sa = _one(docs, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "agentrun-system"}]
    dep = _one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    c = pod["containers"][0]
    assert c["command"] == ["agentrun", "inbox"] and c["securityContext"]["readOnlyRootFilesystem"] is True
    env = _env(dep)
    assert env["AGENTRUN_INBOX_AUTH"] == "token" and env["AGENTRUN_INBOX_LISTEN"] == "0.0.0.0"
    secret = _one(docs, "Secret")
    assert env["AGENTRUN_INBOX_SESSION_KEY"] == {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "session-key"}}
    assert len(secret["data"]["session-key"]) >= 44  # 48 random characters, base64
    svc = _one(docs, "Service")
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_proxy_mode_with_sidecar_listens_on_loopback_and_has_no_tokenreview(helm):
    _, docs = template(helm, *ON, "--set", "inbox.auth=proxy", "--set", "inbox.proxy.sidecar.name=oauth2-proxy",
                       "--set", "inbox.proxy.sidecar.image=quay.io/oauth2-proxy/oauth2-proxy:v7.6.0",
                       "--set", "inbox.impersonate.users={alice,bob}", "--set", "inbox.impersonate.serviceAccounts=false",
                       "--set", "inbox.sessionKeySecretName=mine")
    role = _one(docs, "ClusterRole")
    assert [r["resources"] for r in role["rules"]] == [["users"], ["groups"]]
    assert role["rules"][0]["resourceNames"] == ["alice", "bob"] and "resourceNames" not in role["rules"][1]
    dep = _one(docs, "Deployment")
    env = _env(dep)
    assert env["AGENTRUN_INBOX_LISTEN"] == "127.0.0.1" and env["AGENTRUN_INBOX_AUTH"] == "proxy"
    assert env["AGENTRUN_INBOX_SESSION_KEY"]["secretKeyRef"]["name"] == "mine"
    assert not [d for d in _inbox(docs) if d["kind"] == "Secret"]
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["inbox", "oauth2-proxy"]
    assert "readinessProbe" not in containers[0]
    assert _one(docs, "Service")["spec"]["ports"][0]["targetPort"] == "proxy"


def test_s3_credentials_default_to_the_checkpoint_secret(helm):
    _, docs = template(helm, *ON, "--set", "checkpoint.s3.credentialsSecretName=s3-creds")
    env = _env(_one(docs, "Deployment"))
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}}
    _, docs = template(helm, *ON, "--set", "checkpoint.s3.credentialsSecretName=s3-creds",
                       "--set", "inbox.s3CredentialsSecretName=s3-readonly")
    assert _env(_one(docs, "Deployment"))["AWS_SECRET_ACCESS_KEY"]["secretKeyRef"]["name"] == "s3-readonly"


@pytest.mark.parametrize("flags, expect", [
    (["--set", "inbox.auth=oidc"], ["/inbox/auth", "value must be one of"]),
    (["--set", "inbox.sessionTTL=8 hours"], ["/inbox/sessionTTL"]),
    (["--set", "inbox.namespaces={Team_A}"], ["/inbox/namespaces/0"]),
    (["--set", "inbox.cookieSecure=yes"], ["/inbox/cookieSecure"]),
    (["--set", "inbox.proxy.userHeader=X User"], ["/inbox/proxy/userHeader"]),
    (["--set", "inbox.port=80"], ["/inbox", "'port' not allowed"]),
])
def test_invalid_inbox_values_are_refused_naming_the_path(helm, flags, expect):
    proc, _ = template(helm, *ON, *flags, check=False)
    assert proc.returncode != 0
    for text in expect:
        assert text in proc.stderr, proc.stderr


def _notify_env(helm, tmp_path, *flags, check=True):
    """The chart's agentrun.notifyEnv as the operator Deployment would include it: rendered from a
    copy of the chart with one extra template that includes it."""
    import shutil
    import subprocess

    import yaml
    from helm_support import CHART

    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-notify-probe.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\ndata:\n  env: |\n'
        '    {{- include "agentrun.notifyEnv" . | nindent 4 }}\n')
    proc = subprocess.run([helm, "template", "x", str(chart), "--show-only", "templates/zz-notify-probe.yaml", *flags],
                          capture_output=True, text=True)
    if not check:
        return proc, None
    assert proc.returncode == 0, proc.stderr
    return proc, yaml.safe_load(yaml.safe_load(proc.stdout)["data"]["env"]) or []


def test_notifications_env_of_the_operator(helm, tmp_path):
    _, env = _notify_env(helm, tmp_path)
    assert env == []  # off by default
    _, env = _notify_env(helm, tmp_path / "on", "--set", "notifications.enabled=true", "--set",
                         "notifications.webhook.secretName=hooks", "--set", "notifications.format=slack",
                         "--set", "notifications.inboxURL=https://approvals.example.com")
    by = {e["name"]: e.get("value", e.get("valueFrom")) for e in env}
    assert by["AGENTRUN_NOTIFY_WEBHOOK_URL"] == {"secretKeyRef": {"name": "hooks", "key": "url"}}
    assert by["AGENTRUN_NOTIFY_FORMAT"] == "slack" and by["AGENTRUN_NOTIFY_DEADLINE_NEAR_SECONDS"] == "600"
    assert by["AGENTRUN_INBOX_URL"] == "https://approvals.example.com"
    proc, _ = _notify_env(helm, tmp_path / "nosecret", "--set", "notifications.enabled=true", check=False)
    assert proc.returncode != 0 and "notifications.webhook.secretName" in proc.stderr


@pytest.mark.parametrize("flags, expect", [
    (["--set", "notifications.format=discord"], ["/notifications/format"]),
    (["--set", "notifications.deadlineNearSeconds=0"], ["/notifications/deadlineNearSeconds"]),
    (["--set", "notifications.inboxURL=approvals.example.com"], ["/notifications/inboxURL"]),
    (["--set", "notifications.webhookURL=https://hooks.slack.com/x"], ["'webhookURL' not allowed"]),
])
def test_invalid_notification_values_are_refused(helm, flags, expect):
    proc, _ = template(helm, *flags, check=False)
    assert proc.returncode != 0
    for text in expect:
        assert text in proc.stderr, proc.stderr
