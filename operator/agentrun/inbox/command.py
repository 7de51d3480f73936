"""``agentrun inbox``: serve the approval inbox (docs/inbox.md)."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import ssl
import sys

import click

_DURATION = re.compile(r"^(\d+)([smhd])$")


MAX_RECHECK = 300  # the token is checked again at least every 5 minutes
MIN_PROXY_SECRET = 16


def _seconds(text: str, hint: str = "--session-ttl") -> int:
    m = _DURATION.match(text.strip())
    if not m:
        raise click.BadParameter("a duration such as 30m, 8h or 1d", param_hint=hint)
    return int(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]


def _trace_template(text: str) -> str | None:
    from agentrun.api.traceid import check_template

    if not text.strip():
        return None
    try:
        return check_template(text.strip())
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--trace-url-template") from None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _proxy_secret(path: str) -> bytes:
    """The shared secret of the auth proxy, from a file (a mounted Secret); never logged."""
    try:
        with open(path, "rb") as fh:
            secret = fh.read().strip()
    except OSError as e:
        raise click.BadParameter(f"cannot read it: {e.strerror}", param_hint="--proxy-secret-file") from None
    if len(secret) < MIN_PROXY_SECRET:
        raise click.BadParameter(f"the secret must be at least {MIN_PROXY_SECRET} characters",
                                 param_hint="--proxy-secret-file")
    return secret


@click.command("inbox", short_help="Serve the approval inbox (a web page for approvers).", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--listen", default="0.0.0.0", show_default=True, envvar="AGENTRUN_INBOX_LISTEN", help="Address to bind.")
@click.option("--port", default=8080, show_default=True, type=int, envvar="AGENTRUN_INBOX_PORT",
              help="Port (0: any free port).")
@click.option("--port-file", default=None, help="Write the port bound here once serving (for scripts).")
@click.option("--auth", type=click.Choice(["token", "proxy"]), default="token", show_default=True,
              envvar="AGENTRUN_INBOX_AUTH",
              help="token: people sign in with a bearer token checked by TokenReview; proxy: an auth proxy "
                   "(oauth2-proxy) in front sets the user and groups headers, which the inbox trusts.")
@click.option("--user-header", default="X-Forwarded-User", show_default=True, envvar="AGENTRUN_INBOX_USER_HEADER")
@click.option("--groups-header", default="X-Forwarded-Groups", show_default=True,
              envvar="AGENTRUN_INBOX_GROUPS_HEADER", help="Comma-separated groups (empty: none).")
@click.option("--namespaces", default="", envvar="AGENTRUN_INBOX_NAMESPACES",
              help="Comma-separated namespaces to show (default: every namespace the person may list).")
@click.option("--session-ttl", default="8h", show_default=True, envvar="AGENTRUN_INBOX_SESSION_TTL")
@click.option("--cookie-secure", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              envvar="AGENTRUN_INBOX_COOKIE_SECURE",
              help="auto: Secure cookies unless serving plain HTTP on a loopback address (development).")
@click.option("--tls-cert", default=None, envvar="AGENTRUN_INBOX_TLS_CERT", help="Serve HTTPS with this certificate.")
@click.option("--tls-key", default=None, envvar="AGENTRUN_INBOX_TLS_KEY")
@click.option("--token-audience", "audiences", multiple=True,
              help="Audiences a sign-in token must carry (the TokenReview answer must name one).")
@click.option("--session-recheck", default="5m", show_default=True, envvar="AGENTRUN_INBOX_SESSION_RECHECK",
              help="Token mode: check the session's token again (TokenReview) this often; at most 5m.")
@click.option("--proxy-groups", default="", envvar="AGENTRUN_INBOX_PROXY_GROUPS",
              help="Proxy mode: comma-separated groups taken from the groups header; others are dropped "
                   "(empty: none). system: groups are refused.")
@click.option("--proxy-secret-file", default=None, envvar="AGENTRUN_INBOX_PROXY_SECRET_FILE",
              help="Proxy mode: a file holding the secret the proxy sends in --proxy-secret-header.")
@click.option("--proxy-secret-header", default="X-Agentrun-Proxy-Secret", show_default=True,
              envvar="AGENTRUN_INBOX_PROXY_SECRET_HEADER")
@click.option("--proxy-client-ca", default=None, envvar="AGENTRUN_INBOX_PROXY_CLIENT_CA",
              help="Proxy mode: the CA (PEM) of the proxy's client certificate (mTLS; needs --tls-cert).")
@click.option("--request-timeout", default="10s", show_default=True, envvar="AGENTRUN_INBOX_REQUEST_TIMEOUT",
              help="A connection must send its whole request (and TLS handshake) within this.")
@click.option("--max-pending", default=64, show_default=True, type=click.IntRange(1, 10000),
              envvar="AGENTRUN_INBOX_MAX_PENDING",
              help="Connections that have not sent a whole request yet, at most (a new one closes the oldest).")
@click.option("--laps", default=3, show_default=True, type=click.IntRange(1, 20),
              help="Recent laps shown per pending approval.")
@click.option("--trace-url-template", default="", envvar="AGENTRUN_TRACE_URL_TEMPLATE",
              help="Link each run of the run explorer to its trace: a URL with {trace_id} (e.g. "
                   "https://jaeger.example/trace/{trace_id}); empty: no link.")
@click.option("--kubeconfig", default=None, help="Kubeconfig of the inbox itself (default: in-cluster, KUBECONFIG).")
@click.option("--context", default=None)
def inbox_command(listen: str, port: int, port_file: str | None, auth: str, user_header: str, groups_header: str,
                  namespaces: str, session_ttl: str, cookie_secure: str, tls_cert: str | None, tls_key: str | None,
                  audiences: tuple[str, ...], session_recheck: str, proxy_groups: str, proxy_secret_file: str | None,
                  proxy_secret_header: str, proxy_client_ca: str | None, request_timeout: str, max_pending: int,
                  laps: int, trace_url_template: str, kubeconfig: str | None, context: str | None) -> None:
    """Serve the approval inbox: pending approvals, Approve/Reject, recent decisions, live; and the run
    explorer (/runs): the runs the person may list, each run's laps, cost, Events and trace link.

    Every read and decision goes to the API server impersonating the signed-in person, so the
    inbox's own identity needs only `impersonate` and `tokenreviews create`. The session signing
    key is AGENTRUN_INBOX_SESSION_KEY (at least 32 characters; from a Secret); without it a random
    key is made and sessions end when the process does. S3 credentials (read-only suffice) come
    from the AWS chain, for the run's recent laps."""
    from agentrun.inbox.kube import Kube
    from agentrun.inbox.server import Inbox, Settings, make_server

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    key_text = os.environ.get("AGENTRUN_INBOX_SESSION_KEY", "")
    if key_text and len(key_text) < 32:
        raise click.ClickException("AGENTRUN_INBOX_SESSION_KEY must be at least 32 characters")
    if bool(tls_cert) != bool(tls_key):
        raise click.BadParameter("give both --tls-cert and --tls-key", param_hint="--tls-cert")
    secure = {"always": True, "never": False}.get(cookie_secure, bool(tls_cert) or not _loopback(listen))
    recheck = _seconds(session_recheck, "--session-recheck")
    if not 1 <= recheck <= MAX_RECHECK:
        raise click.BadParameter("between 1s and 5m: a revoked token must end its session within 5 minutes",
                                 param_hint="--session-recheck")
    groups = tuple(g.strip() for g in proxy_groups.split(",") if g.strip())
    for g in groups:
        if g.startswith("system:"):
            raise click.BadParameter(f"{g!r}: system: groups are never taken from proxy headers",
                                     param_hint="--proxy-groups")
    secret = _proxy_secret(proxy_secret_file) if proxy_secret_file else None
    if auth == "proxy" and secret is None and not proxy_client_ca:
        raise click.UsageError("--auth proxy needs --proxy-secret-file and/or --proxy-client-ca: the auth proxy must "
                               "prove to the inbox that it is the proxy (docs/inbox.md \"Trust in proxy mode\")")
    if proxy_client_ca and not tls_cert:
        raise click.BadParameter("needs --tls-cert and --tls-key (client certificates are a TLS thing)",
                                 param_hint="--proxy-client-ca")
    settings = Settings(auth=auth, user_header=user_header, groups_header=groups_header or None,
                        namespaces=tuple(n.strip() for n in namespaces.split(",") if n.strip()),
                        session_ttl=_seconds(session_ttl), secure_cookies=secure, token_audiences=audiences,
                        laps=laps, session_recheck=recheck, proxy_groups=groups, proxy_secret=secret,
                        proxy_secret_header=proxy_secret_header, proxy_mtls=bool(proxy_client_ca),
                        request_timeout=float(_seconds(request_timeout, "--request-timeout")), max_pending=max_pending,
                        trace_url_template=_trace_template(trace_url_template))
    if key_text:
        settings.key = key_text.encode()
    # a connection per watch (at most max_watches), and up to 64 requests of page loads at once
    kube = Kube.connect(kubeconfig, context, pool_size=settings.max_watches + 64)
    ctx = None
    scheme = "http"
    if tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls_cert, tls_key)
        if proxy_client_ca:
            ctx.load_verify_locations(cafile=proxy_client_ca)
            # optional at the handshake, required by every request: a connection without one gets a 401
            # that says why, not a bare handshake failure
            ctx.verify_mode = ssl.CERT_OPTIONAL
        scheme = "https"
    srv = make_server(Inbox(kube, settings), listen, port, tls=ctx)
    bound = srv.server_address[1]
    if port_file:
        with open(port_file + ".tmp", "w") as fh:
            fh.write(str(bound))
        os.replace(port_file + ".tmp", port_file)
    logging.getLogger("agentrun.inbox").info(
        "serving the approval inbox on %s://%s:%s (auth %s, %s, secure cookies %s)", scheme, listen, bound, auth,
        "namespaces " + ",".join(settings.namespaces) if settings.namespaces else "every namespace the person sees",
        secure)
    if auth == "proxy":
        logging.getLogger("agentrun.inbox").info(
            "proxy mode: requests must carry %s; groups taken from %s: %s; system: users and groups are refused",
            " and ".join(([proxy_secret_header[:64]] if secret is not None else [])
                         + (["a client certificate of the proxy CA"] if proxy_client_ca else [])),
            (groups_header or "-")[:64], ",".join(groups)[:300] or "none")
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
        kube.close()
