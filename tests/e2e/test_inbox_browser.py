"""The approval inbox in a real headless browser (Chromium from Debian, driven by Playwright)
against the local control plane, with the real admission policies, the chart's RBAC and two
people made here as ServiceAccounts who sign in with their tokens (TokenReview):

* alice (bound to the chart's agentrun-approver ClusterRole) sees the pending call with its full
  arguments and sha256, cannot reject without a reason, approves; the run reaches Succeeded with
  her name recorded by the API server, and her page shows the decision without a reload;
* bob (may get/list/watch/patch agentruns, not approve) sees it read-only, and a forged POST with
  his session is sent on and refused by the API server's admission policy;
* a decision made with ``kubectl annotate`` while a page is open shows up without reload, and the
  card below keeps its place (no layout shift under the pointer);
* the card shows what the call will run and "N of M approvals" (issue 29);
* a sign-in link (``/login#token=``) fills the form but signs in only on a click; a token session
  ends at the token's expiry and, when the token is revoked, at the next TokenReview; audiences;
* proxy mode answers only its proxy (shared secret) and impersonates only the listed groups.

The inbox runs as a subprocess with a kubeconfig of its own ServiceAccount, bound to the chart's
inbox ClusterRole (rendered by the real helm): it may only impersonate and create TokenReviews.
Screenshots go to AGENTRUN_INBOX_SCREENSHOTS (a directory; docs/images for the docs) or a temp dir.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.cluster import ADMISSION_APIS, sa_kubeconfig
from e2e_support import wait_for
from test_approval_authz import PERMISSION, annotations, approver_clusterrole, waiting_run
from test_operator_e2e import _diagnostics_on_failure, env  # noqa: F401

from agentrun.api.approval import ANN_APPROVED, arguments_sha256

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "agentrun-operator"
PROXY_SECRET = secrets.token_urlsafe(32)
FROM_PROXY = {"X-Agentrun-Proxy-Secret": PROXY_SECRET}
CHROMIUM = os.environ.get("AGENTRUN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class Inbox:
    def __init__(self, env, tmp: Path) -> None:  # noqa: F811
        self.env, self.tmp = env, tmp
        ns = env.ns
        c = env.cluster
        approver_clusterrole(c)
        # the inbox's own identity: exactly the chart's inbox RBAC (ServiceAccount, ClusterRole, binding)
        helm = subprocess.run([str(ROOT / "tools" / "install-helm.sh")], check=True, capture_output=True,
                              text=True).stdout.strip().splitlines()[-1]
        release = f"inbox-{ns}"
        rbac = subprocess.run([helm, "template", release, str(CHART), "--namespace", ns, "--set", "inbox.enabled=true",
                               *ADMISSION_APIS, "--show-only", "templates/inbox-rbac.yaml"], check=True, capture_output=True,
                              text=True).stdout
        c.kubectl_run("apply", "-f", "-", input=rbac)
        self.kubeconfig = sa_kubeconfig(c, ns, f"{release}-agentrun-operator-inbox", tmp / "inbox.kubeconfig")
        # the people: ServiceAccounts whose tokens they sign in with
        for sa in ("alice", "bob"):
            c.kubectl_run("create", "serviceaccount", sa, "-n", ns)
        c.kubectl_run("create", "rolebinding", "alice-approves", "-n", ns, "--clusterrole=agentrun-approver",
                      f"--serviceaccount={ns}:alice")
        c.kubectl_run("create", "role", "run-editor", "-n", ns, "--verb=get,list,watch,patch",
                      "--resource=agentruns.agentrun.dev")
        c.kubectl_run("create", "rolebinding", "bob-edits", "-n", ns, "--role=run-editor", f"--serviceaccount={ns}:bob")
        self.tokens = {sa: c.kubectl_run("create", "token", sa, "-n", ns, "--duration=1h").stdout.strip()
                       for sa in ("alice", "bob")}
        self.users = {sa: f"system:serviceaccount:{ns}:{sa}" for sa in ("alice", "bob")}
        self.log = tmp / "inbox.log"
        self.procs: list[subprocess.Popen] = []
        self.url = self.spawn("token")

    def spawn(self, auth: str, *extra: str) -> str:
        """Start an inbox (``--auth token`` or ``proxy``) as the inbox's ServiceAccount; its URL. In
        proxy mode the proxy proves itself with PROXY_SECRET and only the group finance is taken."""
        port_file = self.tmp / f"inbox-{auth}-{len(self.procs)}.port"
        if auth == "proxy":
            secret_file = self.tmp / "proxy-secret"
            secret_file.write_text(PROXY_SECRET + "\n")
            extra = ("--proxy-secret-file", str(secret_file), "--proxy-groups", "finance", *extra)
        penv = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRUN_", "AWS_", "KUBECONFIG"))}
        penv.update({"AWS_ACCESS_KEY_ID": self.env.s3.access_key, "AWS_SECRET_ACCESS_KEY": self.env.s3.secret_key,
                     "AWS_DEFAULT_REGION": self.env.s3.region, "AGENTRUN_INBOX_SESSION_KEY": secrets.token_urlsafe(32)})
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentrun.cli.main", "inbox", "--listen", "127.0.0.1", "--port", "0", "--auth", auth,
             "--port-file", str(port_file), "--namespaces", self.env.ns, "--kubeconfig", self.kubeconfig, *extra],
            env=penv, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        wait_for("the inbox's port file", lambda: port_file.exists() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, self.log.read_text()
        return f"http://127.0.0.1:{port_file.read_text().strip()}"

    def proxy(self) -> str:
        """One proxy-mode inbox for the tests that need it."""
        if not getattr(self, "_proxy_url", None):
            self._proxy_url = self.spawn("proxy")
        return self._proxy_url

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(20)


@pytest.fixture(scope="module")
def inbox(env, tmp_path_factory):  # noqa: F811
    i = Inbox(env, tmp_path_factory.mktemp("inbox"))
    yield i
    i.stop()
    log = i.log.read_text()
    for token in i.tokens.values():  # no secret in the logs
        assert token not in log
    assert PROXY_SECRET not in log


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        pytest.fail("no chromium on PATH: run tools/install-chromium.sh (Debian's chromium package)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = os.environ.get("AGENTRUN_INBOX_SCREENSHOTS")
    out = Path(d) if d else tmp_path_factory.mktemp("screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def sign_in(browser, inbox, who: str, width: int = 1100, height: int = 900):
    ctx = browser.new_context(viewport={"width": width, "height": height})
    page = ctx.new_page()
    page.goto(f"{inbox.url}/")
    assert page.url.endswith("/login")
    page.fill("#token", inbox.tokens[who])
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#user")
    assert page.text_content("#user") == inbox.users[who]
    page.locator("#live", has_text="Live:").wait_for()  # the event stream is open
    # a marker that a reload would lose
    page.evaluate("window.__noReload = 42")
    return page


def card(page, e, name: str):
    return page.locator(f'article.card[data-key="{e.ns}/{name}"]')


def doc_box(page, locator) -> dict:
    """The element's box in document coordinates (scroll anchoring cannot hide a shift)."""
    box = locator.bounding_box()
    sx, sy = page.evaluate("[window.scrollX, window.scrollY]")
    return {"x": box["x"] + sx, "y": box["y"] + sy}


def no_reload(page) -> None:
    assert page.evaluate("window.__noReload") == 42, "the page was reloaded"


def post_decision(page, fields: dict, csrf: bool = True) -> dict:
    """A POST /decide sent by script from the signed-in page (the person's cookie goes along)."""
    return page.evaluate(
        """async ([fields, csrf]) => {
             const body = new URLSearchParams(fields);
             if (csrf) body.set('csrf', document.getElementById('main').dataset.csrf);
             const headers = {'Accept': 'application/json'};
             const r = await fetch('/decide', {method: 'POST', body, headers, credentials: 'same-origin'});
             return {status: r.status, body: await r.json()};
           }""", [fields, csrf])


def test_approver_sees_the_call_reject_needs_a_reason_and_approves(inbox, browser, shots):
    e = inbox.env
    args = {"order": "inbox-pay", "amount": "1250.50", "currency": "EUR",
            "lines": [{"sku": "A-100", "qty": 3}, {"sku": "<script>alert(1)</script>", "qty": 1}]}
    st = waiting_run(e, "inbox-pay", args)
    page = sign_in(browser, inbox, "alice")
    c = card(page, e, "inbox-pay")
    c.wait_for()
    assert c.locator("dd code:not(.target)").first.text_content() == "refund"
    # where the call goes, as the operator recorded it from the spec (status.approval.target), first
    assert c.locator("code.target").text_content() == (
        f"POST {st['approval']['target']['url']} · image {st['approval']['target']['image']}")
    assert st["approval"]["target"]["url"].endswith("/refund")
    assert c.locator(".sha code").text_content() == arguments_sha256(args) == st["approval"]["argumentsSha256"]
    assert json.loads(c.locator("pre.args").text_content()) == args  # full, escaped (no script ran)
    assert "from the checkpoint store" in c.locator("summary").first.text_content()
    c.locator("summary", has_text="Recent laps").click()
    assert "refunding" in c.locator("ol.laps").text_content()
    assert c.locator(".countdown").text_content().endswith("left")
    page.screenshot(path=str(shots / "inbox-pending.png"), full_page=True)

    # Reject without a reason: refused on the page, nothing sent
    c.locator("button.reject").click()
    assert c.locator(".result").text_content() == "A reason is required to reject."
    assert c.locator("textarea").get_attribute("aria-invalid") == "true"
    # ... and by the server, for a request that skips the page's check
    fields = {"namespace": e.ns, "name": "inbox-pay", "callId": st["approval"]["callId"],
              "sha256": arguments_sha256(args), "decision": "reject", "reason": "  "}
    r = post_decision(page, fields)
    assert r["status"] == 400 and "reason is required" in r["body"]["message"], r
    assert ANN_APPROVED not in annotations(e, "inbox-pay")

    # Approve with a reason (keyboard: type, Tab to Approve, Enter)
    c.locator("textarea").fill("matches PO 4711")
    c.locator("textarea").focus()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "approve"
    page.keyboard.press("Enter")
    # the page confirms ("Approved call ..."), then the live update says who ("... Approved by ...")
    wait_for("the page to confirm", lambda: "Approved" in (c.locator(".result").text_content() or ""), timeout=30)
    final = e.wait_phase("inbox-pay", "Succeeded", "Failed", timeout=180)
    assert final["phase"] == "Succeeded", final
    ap = final["approval"]
    assert (ap["state"], ap["decidedBy"], ap["reason"]) == ("Approved", inbox.users["alice"], "matches PO 4711"), ap
    # the page shows it without reload: the card says so, the history has who and why
    row = page.locator(f'#history tr[data-key="{e.ns}/inbox-pay"]')
    row.wait_for()
    wait_for("the history row", lambda: inbox.users["alice"] in row.text_content() and "Approved" in row.text_content(),
             timeout=30)
    assert "matches PO 4711" in row.text_content()
    assert "No longer waiting: Approved by " + inbox.users["alice"] in c.locator(".gone-note").text_content()
    no_reload(page)
    page.screenshot(path=str(shots / "inbox-decided.png"), full_page=True)
    page.context.close()


def test_non_approver_sees_it_read_only_and_a_forged_post_is_refused_by_the_api_server(inbox, browser):
    e = inbox.env
    st = waiting_run(e, "inbox-ro")
    page = sign_in(browser, inbox, "bob")
    c = card(page, e, "inbox-ro")
    c.wait_for()
    assert "Read-only" in c.locator(".readonly").text_content()
    assert c.locator("form.decide").count() == 0 and c.locator("button").count() == 0
    fields = {"namespace": e.ns, "name": "inbox-ro", "callId": st["approval"]["callId"],
              "sha256": st["approval"]["argumentsSha256"], "decision": "approve", "reason": "forged"}
    # the inbox sends it on as bob; the API server's admission policy refuses it, naming the permission
    r = post_decision(page, fields)
    assert r["status"] == 403 and PERMISSION in r["body"]["message"], r
    # without the page's CSRF token the inbox does not even send it
    r = post_decision(page, fields, csrf=False)
    assert r["status"] == 403 and "CSRF" in r["body"]["message"], r
    assert ANN_APPROVED not in annotations(e, "inbox-ro")
    assert e.status("inbox-ro")["phase"] == "AwaitingApproval"
    page.context.close()


def test_a_kubectl_decision_shows_up_without_reload_and_nothing_moves(inbox, browser, shots):
    e = inbox.env
    for name in ("inbox-k1", "inbox-k2"):  # both at once, then wait for both
        e.apply(e.run_doc(name, [{"content": "refunding", "toolCalls": [{"name": "refund", "arguments": {"order": name}}]},
                                 {"content": "finished"}]))
    for name in ("inbox-k1", "inbox-k2"):
        assert e.wait_phase(name, "AwaitingApproval", "Failed", "Succeeded")["phase"] == "AwaitingApproval"
    page = sign_in(browser, inbox, "alice", width=390, height=844)  # a phone
    cards = [card(page, e, n) for n in ("inbox-k1", "inbox-k2")]
    for c in cards:
        c.wait_for()
    # decide the upper card (the older request) elsewhere; watch the lower one's Approve button
    first, second = sorted(cards, key=lambda c: doc_box(page, c)["y"])
    upper = first.get_attribute("data-key").split("/")[1]
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # readable at phone width
    page.screenshot(path=str(shots / "inbox-phone.png"), full_page=False)
    second.locator("button.approve").scroll_into_view_if_needed()
    before = doc_box(page, second.locator("button.approve"))
    first_height = first.bounding_box()["height"]
    e.kubectl("annotate", "agentrun", upper, "-n", e.ns, f"{ANN_APPROVED}=false",
              "agentrun.dev/reason=declined by kubectl")
    wait_for("the card to say it was decided",
             lambda: "Rejected" in (first.locator(".gone-note").text_content() if first.locator(".gone-note").count()
                                    else ""), timeout=60)
    row = page.locator(f'#history tr[data-key="{e.ns}/{upper}"]')
    assert "declined by kubectl" in row.text_content()
    no_reload(page)
    after = doc_box(page, second.locator("button.approve"))
    assert abs(after["y"] - before["y"]) < 1 and abs(after["x"] - before["x"]) < 1, (before, after)
    assert abs(first.bounding_box()["height"] - first_height) < 1
    assert second.locator("button.approve").is_enabled()
    page.context.close()


def test_sign_in_refuses_a_bad_token_and_pages_carry_no_secrets(inbox, browser):
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(f"{inbox.url}/login")
    page.fill("#token", "not-a-token")
    page.click("#login-form button[type=submit]")
    assert "did not accept" in page.text_content(".error")
    page = sign_in(browser, inbox, "alice")
    html = page.content()
    assert inbox.tokens["alice"] not in html
    cookie = next(c for c in page.context.cookies() if c["name"] == "agentrun_inbox")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert inbox.tokens["alice"] not in cookie["value"]
    # a request from another site: refused before anything is sent to the API server
    r = page.request.post(f"{inbox.url}/decide", headers={"Origin": "https://evil.example"}, form={"x": "1"})
    assert r.status == 403 and "cross-site" in r.json()["message"]
    ctx.close()
    page.context.close()


def test_behind_an_auth_proxy_the_forwarded_user_decides(inbox, browser):
    """--auth proxy: the identity is the proxy's headers (as oauth2-proxy --pass-user-headers sets
    them; the browser context plays the proxy); carol is an approver through her group finance."""
    e = inbox.env
    e.kubectl("create", "rolebinding", "finance-approves", "-n", e.ns, "--clusterrole=agentrun-approver",
              "--group=finance")
    url = inbox.proxy()
    waiting_run(e, "inbox-proxy")
    ctx = browser.new_context(extra_http_headers={**FROM_PROXY, "X-Forwarded-User": "carol",
                                                  "X-Forwarded-Groups": "finance"})
    page = ctx.new_page()
    page.goto(f"{url}/")
    assert page.text_content("#user") == "carol"
    c = card(page, e, "inbox-proxy")
    c.wait_for()
    c.locator("textarea").fill("checked by carol")
    c.locator("button.approve").click()
    final = e.wait_phase("inbox-proxy", "Succeeded", "Failed", timeout=180)
    assert final["phase"] == "Succeeded" and final["approval"]["decidedBy"] == "carol", final
    ctx.close()
    # without the proxy's header: not signed in (the inbox must be reachable only through the proxy)
    anon = browser.new_context(extra_http_headers=FROM_PROXY)
    page = anon.new_page()
    assert page.goto(f"{url}/").status == 401
    anon.close()
    # not from the proxy (no shared secret): refused whoever the headers name
    direct = browser.new_context(extra_http_headers={"X-Forwarded-User": "carol", "X-Forwarded-Groups": "finance"})
    page = direct.new_page()
    r = page.goto(f"{url}/")
    assert r.status == 401 and "only its auth proxy" in page.text_content("main")
    direct.close()


def test_behind_an_auth_proxy_a_forged_system_masters_group_is_refused(inbox):
    """Proxy mode: a pod that reaches the inbox and sends X-Forwarded-Groups: system:masters would
    be cluster-admin through the inbox's impersonation (its ServiceAccount may impersonate any
    group); the inbox refuses system: users and groups from headers before any API request."""
    import httpx

    e = inbox.env
    url = inbox.proxy()
    st = waiting_run(e, "inbox-forged")
    forged = {"X-Forwarded-User": "mallory", "X-Forwarded-Groups": "system:masters"}
    r = httpx.get(f"{url}/fragment", headers=forged)  # not from the proxy: 401 before anything else
    assert r.status_code == 401 and "X-Agentrun-Proxy-Secret" in r.text and "inbox-forged" not in r.text, r.text
    forged = {**FROM_PROXY, **forged}  # from the proxy (as if the proxy passed a client's header on)
    r = httpx.get(f"{url}/fragment", headers=forged)
    assert r.status_code == 403 and "system:masters" in r.text and "inbox-forged" not in r.text, r.text
    fields = {"namespace": e.ns, "name": "inbox-forged", "callId": st["approval"]["callId"],
              "sha256": st["approval"]["argumentsSha256"], "decision": "approve", "reason": "forged"}
    r = httpx.post(f"{url}/decide", headers={**forged, "Accept": "application/json"}, data=fields)
    assert r.status_code == 403 and "system:" in r.json()["message"], r.text
    r = httpx.get(f"{url}/fragment", headers={**forged, "X-Forwarded-User": "system:admin", "X-Forwarded-Groups": ""})
    assert r.status_code == 403 and "system:admin" in r.text
    # the same person without the system: group is signed in (as herself, who may see nothing here)
    r = httpx.get(f"{url}/fragment", headers={**FROM_PROXY, "X-Forwarded-User": "mallory"})
    assert r.status_code == 200 and "inbox-forged" not in r.text
    assert "refused: the auth proxy's headers name the group system:masters" in inbox.log.read_text()
    assert ANN_APPROVED not in annotations(e, "inbox-forged")
    assert e.status("inbox-forged")["phase"] == "AwaitingApproval"


def test_behind_an_auth_proxy_a_group_not_listed_is_not_impersonated(inbox):
    """Proxy mode impersonates only the groups of --proxy-groups (here: finance). A forwarded
    group that holds power (kubeadm:cluster-admins, bound here to the approver role) is dropped:
    the API server sees mallory without it and refuses her decision."""
    import httpx

    e = inbox.env
    e.kubectl("create", "rolebinding", "kubeadm-admins-approve", "-n", e.ns, "--clusterrole=agentrun-approver",
              "--group=kubeadm:cluster-admins")
    url = inbox.proxy()
    st = waiting_run(e, "inbox-unlisted")
    who = {**FROM_PROXY, "X-Forwarded-User": "mallory", "X-Forwarded-Groups": "kubeadm:cluster-admins"}
    r = httpx.get(f"{url}/fragment", headers=who)
    assert r.status_code == 200 and "inbox-unlisted" not in r.text  # without the group she may not even list
    fields = {"namespace": e.ns, "name": "inbox-unlisted", "callId": st["approval"]["callId"],
              "sha256": st["approval"]["argumentsSha256"], "decision": "approve", "reason": "as an unlisted group"}
    csrf_page = httpx.get(f"{url}/", headers=who)
    cookie = csrf_page.cookies.get("agentrun_inbox")
    csrf = re.search(r'data-csrf="([^"]+)"', csrf_page.text)[1]
    r = httpx.post(f"{url}/decide", headers={**who, "Accept": "application/json"}, data={**fields, "csrf": csrf},
                   cookies={"agentrun_inbox": cookie})
    assert r.status_code in (403, 404), r.text  # read as mallory without the group: forbidden
    assert ANN_APPROVED not in annotations(e, "inbox-unlisted")
    assert e.status("inbox-unlisted")["phase"] == "AwaitingApproval"


def test_the_card_shows_what_the_call_will_run_and_n_of_m_approvals(inbox, browser, shots):
    """The target and "1 of 2" on the card (issue 29), from what the operator recorded: a run whose
    gated tool sends headers from a Secret and needs two approvers; one approval (the admin's,
    stamped by the API server) is in; the card names the target and "1 of 2", and its form carries
    the target digest the decision will be bound to."""
    e = inbox.env
    name = "inbox-target"
    e.kubectl("create", "secret", "generic", "pay-creds", "-n", e.ns, "--from-literal=headers={\"X-Pay\": \"1\"}")
    doc = e.run_doc(name, [{"content": "refunding", "toolCalls": [{"name": "refund", "arguments": {"order": name}}]},
                           {"content": "finished"}])
    doc["spec"]["approval"]["approvers"] = 2
    refund = next(t for t in doc["spec"]["agent"]["tools"] if t["name"] == "refund")
    refund["http"]["headersSecretRef"] = {"name": "pay-creds", "key": "headers"}
    e.apply(doc)
    st = e.wait_phase(name, "AwaitingApproval", "Failed", "Succeeded", timeout=180)
    assert st["phase"] == "AwaitingApproval", st
    e.kubectl("annotate", "agentrun", name, "-n", e.ns, f"{ANN_APPROVED}=true")
    ap = wait_for("one approval of two recorded", lambda: (lambda a: a if len(a.get("approvedBy") or []) == 1 else None)(
        e.status(name)["approval"]), timeout=120)
    assert ap["state"] == "Pending" and ap["approvalsRequired"] == 2, ap
    first = ap["approvedBy"][0]["user"]
    target = ap["target"]
    assert target["url"].endswith("/refund") and target["headersSecret"] == "pay-creds", target
    page = sign_in(browser, inbox, "bob")
    c = card(page, e, name)
    c.wait_for()
    assert c.locator("code.target").text_content() == (
        f"POST {target['url']} · headers from Secret pay-creds · image {target['image']}")
    assert c.locator(".approvals").text_content() == f"1 of 2 approvals ({first})"
    page.screenshot(path=str(shots / "inbox-target.png"), full_page=True)
    page.context.close()
    page = sign_in(browser, inbox, "alice")
    c = card(page, e, name)
    c.wait_for()
    assert c.locator("input[name=callId]").get_attribute("value") == ap["callId"]
    assert c.locator("input[name=sha256]").get_attribute("value") == ap["argumentsSha256"]
    assert c.locator("input[name=targetSha256]").get_attribute("value") == ap["targetSha256"]
    page.context.close()


def test_a_sign_in_link_fills_the_form_but_signs_in_only_on_a_click(inbox, browser):
    """/login#token= (make dev's link) used to submit itself: a link from someone else signed the
    person in as that someone (login CSRF). Now it fills the form and waits for a click."""
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(f"{inbox.url}/login#token={inbox.tokens['bob']}")
    page.locator("#from-link").wait_for()
    page.wait_for_timeout(1500)  # time for a submit that must not happen
    assert page.url == f"{inbox.url}/login" and page.locator("#user").count() == 0
    assert not [c for c in ctx.cookies() if c["name"] == "agentrun_inbox"]
    assert page.input_value("#token") == inbox.tokens["bob"]
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#user")
    assert page.text_content("#user") == inbox.users["bob"]
    # a form posted from elsewhere (no sign-in cookie of this page, no CSRF token): refused
    r = ctx.request.post(f"{inbox.url}/login", form={"token": inbox.tokens["bob"]})
    assert r.status == 403 and "sign-in form" in r.text()
    ctx.close()


def test_a_token_session_ends_at_the_tokens_expiry_and_at_its_revocation(inbox):
    """Against the API server's own TokenReview: a 10-minute token gives a session of at most 10
    minutes (not --session-ttl); the token is checked again every --session-recheck, so deleting
    its ServiceAccount ends the session; --token-audience is checked (a token for the inbox's
    audience signs in, a token for the API server's default audience does not)."""
    import httpx

    e = inbox.env
    c = e.cluster
    c.kubectl_run("create", "serviceaccount", "carl", "-n", e.ns)
    token = c.kubectl_run("create", "token", "carl", "-n", e.ns, "--duration=10m",
                          "--audience=agentrun-inbox").stdout.strip()
    plain = c.kubectl_run("create", "token", "carl", "-n", e.ns, "--duration=10m").stdout.strip()
    url = inbox.spawn("token", "--session-recheck", "2s", "--token-audience", "agentrun-inbox")

    def sign_in_with(tok: str) -> tuple[httpx.Client, httpx.Response]:
        client = httpx.Client(base_url=url, timeout=30)
        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)[1]
        return client, client.post("/login", data={"token": tok, "csrf": csrf})

    _, r = sign_in_with(plain)
    assert r.status_code == 401, r.text  # not for the inbox's audience
    client, r = sign_in_with(token)
    assert r.status_code == 303, r.text
    max_age = int(re.search(r"agentrun_inbox=[^;]*; Path=/; Max-Age=(\d+)", r.headers["set-cookie"])[1])
    assert max_age <= 600, r.headers["set-cookie"]  # the token's exp, not the 8 h session ttl
    assert token not in r.headers["set-cookie"]
    assert client.get("/fragment").status_code == 200
    c.kubectl_run("delete", "serviceaccount", "carl", "-n", e.ns)  # revokes its tokens
    r = wait_for("the session to end", lambda: (x := client.get("/fragment")).status_code == 401 and x, timeout=30)
    assert "session ended" in r.json()["message"]
    inbox.tokens["carl"] = token  # checked absent from the inbox's log at the end
