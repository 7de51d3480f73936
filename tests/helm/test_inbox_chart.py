"""The approval inbox in the chart (docs/inbox.md), rendered by the real helm: off by default; on,
its own Deployment/Service/ServiceAccount, a ClusterRole that may only impersonate (and create
TokenReviews in token mode), the session key from a Secret, and values refused by the schema."""
from __future__ import annotations

import pytest
from helm_support import ROOT, template

NP_VALUES = ROOT / "tests" / "helm" / "networkpolicy-values.yaml"

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


def test_token_mode_rechecks_sessions_and_bounds_half_sent_requests(helm):
    env = _env(_one(template(helm, *ON)[1], "Deployment"))
    assert (env["AGENTRUN_INBOX_SESSION_RECHECK"], env["AGENTRUN_INBOX_REQUEST_TIMEOUT"],
            env["AGENTRUN_INBOX_MAX_PENDING"]) == ("5m", "10s", "64")
    assert not [k for k in env if k.startswith("AGENTRUN_INBOX_PROXY_")]  # token mode: no proxy settings
    env = _env(_one(template(helm, *ON, "--set", "inbox.sessionRecheck=90s", "--set", "inbox.maxPending=8")[1],
                    "Deployment"))
    assert env["AGENTRUN_INBOX_SESSION_RECHECK"] == "90s" and env["AGENTRUN_INBOX_MAX_PENDING"] == "8"


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
    (["--set", "inbox.sessionRecheck=10m"], ["/inbox/sessionRecheck"]),
    (["--set", "inbox.sessionRecheck=0s"], ["/inbox/sessionRecheck"]),
    (["--set", "inbox.maxPending=0"], ["/inbox/maxPending"]),
    (["--set", "inbox.proxy.allowedGroups={a\\,b}"], ["/inbox/proxy/allowedGroups/0"]),
    (["--set", "inbox.proxy.auth.secret=x"], ["/inbox/proxy/auth", "'secret' not allowed"]),
    (["--set", "inbox.tls.secretName=Bad_Name"], ["/inbox/tls/secretName"]),
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
    from helm_support import ADMISSION_APIS, CHART

    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-notify-probe.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\ndata:\n  env: |\n'
        '    {{- include "agentrun.notifyEnv" . | nindent 4 }}\n')
    proc = subprocess.run([helm, "template", "x", str(chart), *ADMISSION_APIS, "--show-only", "templates/zz-notify-probe.yaml",
                           *flags],
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


# --- proxy mode's trust (docs/inbox.md "Trust") and the NetworkPolicies of the operator and the inbox ---

PROXY = [*ON, "--set", "inbox.auth=proxy"]
FRONT = [*PROXY, "--set", "inbox.proxy.frontProxy.trusted=true",
         "--set", "inbox.proxy.frontProxy.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=auth",
         "--set", "inbox.proxy.frontProxy.podSelector.matchLabels.app=oauth2-proxy"]
SIDECAR = ["--set", "inbox.proxy.sidecar.name=oauth2-proxy", "--set", "inbox.proxy.sidecar.image=oauth2-proxy:v7"]


def _policies(docs):
    return {d["metadata"]["name"].removeprefix("agentrun-operator-"): d for d in docs if d["kind"] == "NetworkPolicy"}


def _pod_labels(docs, component):
    dep = next(d for d in docs if d["kind"] == "Deployment"
               and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    return dep["spec"]["template"]["metadata"]["labels"]


def _selects(policy, labels):
    sel = policy["spec"]["podSelector"]
    assert set(sel) == {"matchLabels"}, sel
    return all(labels.get(k) == v for k, v in sel["matchLabels"].items())


def test_proxy_mode_without_a_sidecar_is_refused_unless_a_front_proxy_is_acknowledged(helm):
    proc, _ = template(helm, *PROXY, check=False)
    assert proc.returncode != 0
    assert "inbox.proxy.frontProxy.trusted" in proc.stderr and "inbox.proxy.sidecar" in proc.stderr, proc.stderr
    proc, _ = template(helm, *PROXY, "--set", "inbox.proxy.frontProxy.trusted=true", check=False)
    assert proc.returncode != 0 and "inbox.proxy.frontProxy.podSelector" in proc.stderr, proc.stderr


def test_a_trusted_front_proxy_is_the_only_peer_let_in(helm):
    for flags in (FRONT, [*FRONT, "--set", "networkPolicy.enabled=false"]):  # rendered either way
        _, docs = template(helm, *flags)
        pol = _policies(docs)["inbox-ingress"]
        assert pol["spec"]["policyTypes"] == ["Ingress"]
        assert _selects(pol, _pod_labels(docs, "inbox")) and not _selects(pol, _pod_labels(docs, "operator"))
        assert pol["spec"]["ingress"] == [{
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "auth"}},
                      "podSelector": {"matchLabels": {"app": "oauth2-proxy"}}}],
            "ports": [{"protocol": "TCP", "port": 8080}]}]
        assert _env(_one(docs, "Deployment"))["AGENTRUN_INBOX_LISTEN"] == "0.0.0.0"
    # a sidecar or token mode: no ingress policy (loopback only; a token is needed)
    for flags in ([*PROXY, *SIDECAR], ON):
        _, docs = template(helm, *flags)
        assert "inbox-ingress" not in _policies(docs)


def test_proxy_mode_may_not_impersonate_service_accounts_and_system_masters_is_refused(helm):
    _, docs = template(helm, *PROXY, *SIDECAR)
    assert [r["resources"] for r in _one(docs, "ClusterRole")["rules"]] == [["users"], ["groups"]]
    for key in ("groups", "users"):
        proc, _ = template(helm, *ON, "--set", f"inbox.impersonate.{key}={{finance,system:masters}}", check=False)
        assert proc.returncode != 0 and "system:masters" in proc.stderr, proc.stderr
    _, docs = template(helm, *ON, "--set", "inbox.impersonate.groups={finance,system:authenticated}")
    assert _one(docs, "ClusterRole")["rules"][1]["resourceNames"] == ["finance", "system:authenticated"]


def test_the_operator_policy_selects_only_the_operator_and_lets_the_webhook_out(helm):
    hooks = ["--set", "notifications.enabled=true", "--set", "notifications.webhook.secretName=hooks"]
    store = ["--set", "networkPolicy.store.cidrs={10.40.0.0/24}", "--set", "networkPolicy.store.ports={9000}"]
    _, docs = template(helm, *ON, *hooks, *store)
    pol = _policies(docs)["operator-egress"]
    assert _selects(pol, _pod_labels(docs, "operator")) and not _selects(pol, _pod_labels(docs, "inbox"))
    webhook = pol["spec"]["egress"][-1]
    assert webhook["ports"] == [{"protocol": "TCP", "port": 443}]
    assert webhook["to"][0]["ipBlock"]["cidr"] == "0.0.0.0/0" and "169.254.0.0/16" in webhook["to"][0]["ipBlock"]["except"]
    _, docs = template(helm, *hooks, *store, "--set", "networkPolicy.webhook.cidrs={10.50.0.0/16}",
                       "--set", "networkPolicy.webhook.ports={8443}")
    assert _policies(docs)["operator-egress"]["spec"]["egress"][-1] == {
        "to": [{"ipBlock": {"cidr": "10.50.0.0/16"}}], "ports": [{"protocol": "TCP", "port": 8443}]}
    _, docs = template(helm, *store)  # notifications off: DNS, API server, store only
    assert len(_policies(docs)["operator-egress"]["spec"]["egress"]) == 3


def test_the_inbox_has_its_own_egress_policy(helm):
    values = ["-f", str(NP_VALUES)]  # the inbox behind a front proxy, an extra egress rule (dex)
    dex = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dex"}}}],
           "ports": [{"protocol": "TCP", "port": 5556}]}
    _, docs = template(helm, *values)
    pol = _policies(docs)["inbox-egress"]
    assert _selects(pol, _pod_labels(docs, "inbox")) and not _selects(pol, _pod_labels(docs, "operator"))
    operator = _policies(docs)["operator-egress"]["spec"]["egress"]
    egress = pol["spec"]["egress"]
    assert egress[:3] == operator[:3]  # DNS, the API server, the store: the same rules as the operator's
    assert {p["port"] for p in egress[0]["ports"]} == {53}
    assert egress[3:] == [dex]  # no sidecar: no OIDC issuer rule (the front proxy does the OIDC)
    # with the auth proxy sidecar: its OIDC issuer too (public internet, or the CIDRs given); extra rules last
    sidecar = [*SIDECAR, "--set", "inbox.proxy.frontProxy.trusted=false"]
    _, docs = template(helm, *values, *sidecar)
    egress = _policies(docs)["inbox-egress"]["spec"]["egress"]
    assert egress[3]["ports"] == [{"protocol": "TCP", "port": 443}] and egress[3]["to"][0]["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert "169.254.0.0/16" in egress[3]["to"][0]["ipBlock"]["except"] and egress[4:] == [dex]
    _, docs = template(helm, *values, *sidecar, "--set", "networkPolicy.inbox.oidcIssuer.cidrs={10.60.0.5/32}")
    assert _policies(docs)["inbox-egress"]["spec"]["egress"][3]["to"] == [{"ipBlock": {"cidr": "10.60.0.5/32"}}]
    _, docs = template(helm)  # no inbox: no inbox policy
    assert "inbox-egress" not in _policies(docs)


@pytest.mark.parametrize("flags, expect", [
    (["--set", "inbox.proxy.frontProxy.trust=true"], ["/inbox/proxy/frontProxy", "'trust' not allowed"]),
    (["--set", "inbox.proxy.frontProxy.podSelector.app=x"], ["/inbox/proxy/frontProxy/podSelector", "'app' not allowed"]),
    (["--set", "networkPolicy.webhook.cidrs={hooks.slack.com}"], ["/networkPolicy/webhook/cidrs/0"]),
    (["--set", "networkPolicy.inbox.oidcIssuer.ports={0}"], ["/networkPolicy/inbox/oidcIssuer/ports/0"]),
])
def test_invalid_proxy_and_policy_values_are_refused(helm, flags, expect):
    proc, _ = template(helm, *ON, *flags, check=False)
    assert proc.returncode != 0
    for text in expect:
        assert text in proc.stderr, proc.stderr


# --- proxy mode: the proxy proves itself, only the listed groups (issue 29) ---

def _volumes(dep):
    return {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}


def _mounts(dep):
    return {m["name"]: m["mountPath"] for m in dep["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}


def test_proxy_mode_has_a_shared_secret_and_the_allowed_groups(helm):
    _, docs = template(helm, *PROXY, *SIDECAR, "--set", "inbox.proxy.allowedGroups={finance,ops}")
    dep = _one(docs, "Deployment")
    env = _env(dep)
    assert env["AGENTRUN_INBOX_PROXY_GROUPS"] == "finance,ops"
    assert env["AGENTRUN_INBOX_PROXY_SECRET_HEADER"] == "X-Agentrun-Proxy-Secret"
    path = env["AGENTRUN_INBOX_PROXY_SECRET_FILE"]
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-inbox-proxy"))
    assert len(secret["data"]["proxy-secret"]) >= 44
    vol = _volumes(dep)["proxy-secret"]["secret"]
    assert vol["secretName"] == secret["metadata"]["name"] and vol["items"] == [{"key": "proxy-secret",
                                                                                 "path": "proxy-secret"}]
    assert path == _mounts(dep)["proxy-secret"] + "/proxy-secret"
    assert "AGENTRUN_INBOX_PROXY_CLIENT_CA" not in env
    # a Secret of your own: the chart makes none
    _, docs = template(helm, *PROXY, *SIDECAR, "--set", "inbox.proxy.auth.secretName=proxy-shared")
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-inbox-proxy")]
    assert _volumes(_one(docs, "Deployment"))["proxy-secret"]["secret"]["secretName"] == "proxy-shared"
    # token mode: no proxy secret
    _, docs = template(helm, *ON)
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-inbox-proxy")]
    assert "proxy-secret" not in _volumes(_one(docs, "Deployment"))


def test_proxy_mode_with_mtls_serves_tls_and_verifies_the_proxys_certificate(helm):
    _, docs = template(helm, *PROXY, *SIDECAR, "--set", "inbox.proxy.auth.sharedSecret=false",
                       "--set", "inbox.proxy.auth.clientCASecretName=proxy-ca", "--set", "inbox.tls.secretName=inbox-tls")
    dep = _one(docs, "Deployment")
    env = _env(dep)
    assert env["AGENTRUN_INBOX_PROXY_CLIENT_CA"] == _mounts(dep)["proxy-ca"] + "/ca.crt"
    assert env["AGENTRUN_INBOX_TLS_CERT"] == _mounts(dep)["tls"] + "/tls.crt"
    assert env["AGENTRUN_INBOX_TLS_KEY"] == _mounts(dep)["tls"] + "/tls.key"
    assert _volumes(dep)["proxy-ca"]["secret"]["secretName"] == "proxy-ca"
    assert "AGENTRUN_INBOX_PROXY_SECRET_FILE" not in env and "proxy-secret" not in _volumes(dep)
    _, docs = template(helm, *ON, "--set", "inbox.tls.secretName=inbox-tls")
    c = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


@pytest.mark.parametrize("flags, expect", [
    (["--set", "inbox.proxy.auth.sharedSecret=false"], "inbox.proxy.auth.sharedSecret=true and/or"),
    (["--set", "inbox.proxy.auth.clientCASecretName=ca"], "inbox.proxy.auth.clientCASecretName needs inbox.tls.secretName"),
    (["--set", "inbox.proxy.allowedGroups={finance,system:masters}"], "must not list system:masters"),
])
def test_proxy_mode_without_proof_of_the_proxy_or_with_system_groups_is_refused(helm, flags, expect):
    proc, _ = template(helm, *PROXY, *SIDECAR, *flags, check=False)
    assert proc.returncode != 0 and expect in proc.stderr, proc.stderr
