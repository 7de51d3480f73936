"""The lap's connect-time address check (docs/security.md, "At connect time").

Admission judges the host a URL *names*; this judges the address a connection *reaches*, whatever
name it came from: a wildcard-DNS name (``169.254.169.254.nip.io``), a name that resolves to a
loopback or cluster address, or DNS rebinding (a name that resolved to a public address at one
time and to the metadata service the next). Like Stripe's Smokescreen, the check is made on the
addresses the connection is then opened to, resolved once: nothing resolves the name again in
between.

The lap's one HTTP client is httpx (model calls: ``lap/models/openai.py``; tool calls:
``lap/tools/http.py``); :func:`guarded_client` makes it with :class:`GuardedBackend` as the
network backend of its connection pools (the direct one and any proxy's), so every TCP
connection it opens goes through :meth:`GuardedBackend.connect_tcp`: resolve, check every
address against :func:`agentrun.api.addresses.address_refusal`, connect to a checked address. A
refusal raises :class:`AddressRefused` (permanent: the lap fails with the host, the address and
the rule named) before any byte is sent. With an HTTP proxy in the environment the connection
is to the proxy, and its address is what is checked (the proxy resolves the target).

The rules (:class:`agentrun.api.addresses.AddressRules`) come from the operator, made from the
AgentRunPolicies it resolved for the run (``AGENTRUN_ADDRESS_RULES``); without them the
always-denied ranges still apply.

The checkpoint store's client is botocore (``checkpoint/s3store.py``), over
urllib3, whose connections have no per-client hook: where a run names its own store
(``spec.checkpoint.endpoint``), the lap process (``agentrun lap``, not the operator) routes
urllib3's ``create_connection`` through :func:`guard_store_connections`, which checks the
connections to that endpoint's host (and its virtual-host subdomains) against the run's rules.
Other urllib3 connections are left alone: botocore's credential providers reach the instance
metadata or the EKS Pod Identity agent at link-local addresses by design, and the operator's
own store is the platform's choice.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agentrun.api.addresses import AddressRefusal, AddressRules, IPAddr, address_refusal
from agentrun.api.contract import Env
from agentrun.api.text import one_line
from agentrun.lap.errors import ConfigError, PermanentLapError

if TYPE_CHECKING:
    import httpx

MAX_HOST_CHARS = 200


class AddressRefused(PermanentLapError, AddressRefusal):
    """A connection the address rules refuse; nothing was sent. Not an OSError: httpx and httpcore
    pass it through unchanged (a connection error would be retried as transient)."""


def rules_from_env(env: Mapping[str, str]) -> AddressRules:
    """The rules the operator handed the lap (``AGENTRUN_ADDRESS_RULES``); the always-denied ranges
    only when it is not set. A malformed value is a ConfigError naming the variable."""
    raw = env.get(Env.ADDRESS_RULES, "").strip()
    if not raw:
        return AddressRules()
    try:
        return AddressRules.from_env(raw)
    except ValueError as e:
        raise ConfigError(f"{Env.ADDRESS_RULES} is not valid: {one_line(str(e), 200)}") from None


def resolve(host: str, port: int) -> list[IPAddr]:
    """The addresses of ``host`` in the resolver's order, each once (an IP literal: itself)."""
    out: list[IPAddr] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        a = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if a not in out:
            out.append(a)
    return out


def check_host(host: str, addresses: Iterable[IPAddr], rules: AddressRules) -> None:
    """Raise :class:`AddressRefused` if any address of ``host`` is refused (a name with one denied
    address among good ones is refused as a whole: the resolver could hand out either)."""
    for a in addresses:
        why = address_refusal(a, rules)
        if why is not None:
            name = host if len(host) <= MAX_HOST_CHARS else host[:MAX_HOST_CHARS] + "..."
            raise AddressRefused(f'connection to host "{name}" refused: {why}; no request was sent')


class GuardedBackend:
    """An httpcore network backend (``connect_tcp``, ``connect_unix_socket``, ``sleep``) that checks
    the resolved addresses of every TCP connection before opening it, then opens it to a checked
    address with the backend it wraps (TLS still verifies and sends the URL's host name)."""

    def __init__(self, rules: AddressRules, inner: Any) -> None:
        self.rules = rules
        self.inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> Any:
        import httpcore

        try:
            addresses = resolve(host, port)
        except OSError as e:  # as the backend itself reports a name that does not resolve
            raise httpcore.ConnectError(str(e)) from e
        check_host(host, addresses, self.rules)
        last: Exception | None = None
        for a in addresses:
            try:
                return self.inner.connect_tcp(str(a), port, timeout=timeout, local_address=local_address,
                                              socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                last = e
        raise last if last is not None else httpcore.ConnectError(f"no address for {host}")

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> Any:
        return self.inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options)

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


def guard(client: httpx.Client, rules: AddressRules) -> httpx.Client:
    """Put :class:`GuardedBackend` under every connection pool of ``client`` (its transport and its
    proxy mounts). httpx has no public hook for the network backend: a client whose pools are not
    where httpx 0.28 keeps them is refused (ConfigError), never used unguarded."""
    transports = [client._transport, *(t for t in client._mounts.values() if t is not None)]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        if pool is None or not hasattr(pool, "_network_backend"):
            raise ConfigError(f"cannot check connection addresses with this httpx ({type(transport).__name__} "
                              "has no connection pool where httpx 0.28 keeps it)")
        if not isinstance(pool._network_backend, GuardedBackend):
            pool._network_backend = GuardedBackend(rules, pool._network_backend)
    return client


TraceHeaders = Callable[[], Mapping[str, str]]
"""The W3C trace context of the current span (``Tracer.headers``), added to every request."""


def guarded_client(rules: AddressRules, trace: TraceHeaders | None = None, **kwargs: Any) -> httpx.Client:
    """``httpx.Client(**kwargs)`` whose every connection is checked (:func:`guard`) and, with
    ``trace``, whose every request carries the trace context (``traceparent``) of the span it is sent in."""
    from agentrun.lap.httpx_lite import httpx

    if trace is not None:
        kwargs["event_hooks"] = {"request": [lambda request: request.headers.update(trace())]}
    return guard(httpx.Client(**kwargs), rules)


_STORE_RULES: list[tuple[str, AddressRules]] = []
"""(endpoint host, rules) of :func:`guard_store_connections` (set once per lap process)."""


def guard_store_connections(endpoint_host: str, rules: AddressRules) -> None:
    """In the lap process: every urllib3 connection to ``endpoint_host`` or a subdomain of it (the
    run's own checkpoint store, path-style or virtual-host) is checked like
    :meth:`GuardedBackend.connect_tcp` does, against ``rules``. A refusal raises
    :class:`AddressRefused` (not an OSError: urllib3 passes it through; the store reports it,
    naming the host, the address and the rule, as a permanent failure). Installed once; a second
    call only replaces the host and the rules."""
    from urllib3.util import connection

    first = not _STORE_RULES
    _STORE_RULES[:] = [(endpoint_host.lower().rstrip("."), rules)]
    if not first:
        return
    original = connection.create_connection

    def create_connection(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        host, port = address
        guarded, rules = _STORE_RULES[0]
        name = host.lower().rstrip(".").strip("[]")
        if name != guarded and not name.endswith("." + guarded):
            return original(address, *args, **kwargs)
        addresses = resolve(host, port)
        check_host(host, addresses, rules)
        last: OSError | None = None
        for a in addresses:
            try:
                return original((str(a), port), *args, **kwargs)
            except OSError as e:
                last = e
        raise last if last is not None else OSError(f"no address for {host}")

    connection.create_connection = create_connection
