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


def _seconds(text: str) -> int:
    m = _DURATION.match(text.strip())
    if not m:
        raise click.BadParameter("a duration such as 30m, 8h or 1d", param_hint="--session-ttl")
    return int(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("inbox", short_help="Serve the approval inbox (a web page for approvers).")
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
@click.option("--token-audience", "audiences", multiple=True, help="Audiences a sign-in token must carry.")
@click.option("--laps", default=3, show_default=True, type=click.IntRange(1, 20),
              help="Recent laps shown per pending approval.")
@click.option("--kubeconfig", default=None, help="Kubeconfig of the inbox itself (default: in-cluster, KUBECONFIG).")
@click.option("--context", default=None)
def inbox_command(listen: str, port: int, port_file: str | None, auth: str, user_header: str, groups_header: str,
                  namespaces: str, session_ttl: str, cookie_secure: str, tls_cert: str | None, tls_key: str | None,
                  audiences: tuple[str, ...], laps: int, kubeconfig: str | None, context: str | None) -> None:
    """Serve the approval inbox: pending approvals, Approve/Reject, recent decisions, live.

    Every read and decision goes to the API server impersonating the signed-in person, so the
    inbox's own identity needs only `impersonate` and `tokenreviews create`. The session signing
    key is AGENTRUN_INBOX_SESSION_KEY (at least 32 characters; from a Secret); without it a random
    key is made and sessions end when the process does. S3 credentials (read-only suffice) come
    from the AWS chain, for the run's recent laps."""
    from agentrun.inbox.kube import Kube, load_connection
    from agentrun.inbox.server import Inbox, Settings, make_server

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its INFO lines are one per request
    key_text = os.environ.get("AGENTRUN_INBOX_SESSION_KEY", "")
    if key_text and len(key_text) < 32:
        raise click.ClickException("AGENTRUN_INBOX_SESSION_KEY must be at least 32 characters")
    if bool(tls_cert) != bool(tls_key):
        raise click.BadParameter("give both --tls-cert and --tls-key", param_hint="--tls-cert")
    secure = {"always": True, "never": False}.get(cookie_secure, bool(tls_cert) or not _loopback(listen))
    settings = Settings(auth=auth, user_header=user_header, groups_header=groups_header or None,
                        namespaces=tuple(n.strip() for n in namespaces.split(",") if n.strip()),
                        session_ttl=_seconds(session_ttl), secure_cookies=secure, token_audiences=audiences,
                        laps=laps)
    if key_text:
        settings.key = key_text.encode()
    kube = Kube(load_connection(kubeconfig, context))
    srv = make_server(Inbox(kube, settings), listen, port)
    scheme = "http"
    if tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls_cert, tls_key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        scheme = "https"
    bound = srv.server_address[1]
    if port_file:
        with open(port_file + ".tmp", "w") as fh:
            fh.write(str(bound))
        os.replace(port_file + ".tmp", port_file)
    logging.getLogger("agentrun.inbox").info(
        "serving the approval inbox on %s://%s:%s (auth %s, %s, secure cookies %s)", scheme, listen, bound, auth,
        "namespaces " + ",".join(settings.namespaces) if settings.namespaces else "every namespace the person sees",
        secure)
    if auth == "proxy" and not _loopback(listen):
        logging.getLogger("agentrun.inbox").warning(
            "proxy mode on %s: the inbox believes the %s/%s headers of whatever reaches this port, so only the "
            "auth proxy may reach it (a sidecar on 127.0.0.1, or an ingress NetworkPolicy: docs/inbox.md, "
            "\"Trust in proxy mode\"); system: users and groups are refused whatever it sends", listen,
            user_header[:64], (groups_header or "-")[:64])
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
