"""Cluster access for the ``agentrun`` commands: kubectl-like flags, one-line errors.

Every cluster-facing command takes ``--kubeconfig``, ``--context``, ``-n/--namespace``,
``-A/--all-namespaces`` (the listings), ``--as``, ``--as-group`` and ``--request-timeout`` through
:func:`kube_options`; the ``agentrun`` group takes them too, so they go before or after the
subcommand. The default namespace is the kubeconfig context's, like kubectl (in a pod: the service
account's). Every file of a ``KUBECONFIG`` list is read and merged as kubectl merges them (the
kubernetes client's ``KubeConfigMerger``: the first file to set a value wins). The options are kept
in the click context (``KubeOptions``), so helpers deep in a command find them without threading
them through every call. Every API object is built on :func:`api_client`: the impersonation headers
and the request timeout are set there, once.

Errors are :class:`CLIError`: printed as one line ``agentrun: <message>``, never a traceback, with
the exit code of its kind (``cli.exitcodes.ExitCode``; ``main.LazyGroup`` also turns an unexpected
API/network error into one line).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import click

from agentrun.api.crdgen import GROUP, PLURAL, VERSION
from agentrun.cli.exitcodes import ExitCode
from agentrun.cli.output import parse_duration

F = TypeVar("F", bound=Callable[..., Any])
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class CLIError(click.ClickException):
    """A one-line error: ``agentrun: <message>`` on stderr, exit code ``code`` (default ERROR, 1)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.ERROR) -> None:
        super().__init__(message)
        self.exit_code = int(code)  # type: ignore[misc]  # click declares it a ClassVar; one per error here

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"agentrun: {self.format_message()}", err=True, file=file)


@dataclass
class KubeOptions:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False
    as_user: str | None = None
    as_group: tuple[str, ...] = ()
    request_timeout: str | None = None

    def timeout_seconds(self) -> float | None:
        """``--request-timeout`` in seconds (None: no timeout, kubectl's ``0``)."""
        if not self.request_timeout:
            return None
        seconds = parse_duration(self.request_timeout)
        return seconds or None


def _check_timeout(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        try:
            parse_duration(value)
        except ValueError as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from None


def kube_options(all_namespaces: bool = False) -> Callable[[F], F]:
    """The kubectl-like flags of a cluster-facing command (``all_namespaces``: it takes ``-A``).
    They are also kept, merged with any given on the ``agentrun`` group (before the subcommand),
    in ``ctx.find_object(KubeOptions)``; a flag after the subcommand wins, ``--as-group`` adds."""

    def decorate(f: F) -> F:
        def remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
            opts = ctx.find_object(KubeOptions)
            if opts is None:
                opts = ctx.ensure_object(KubeOptions)
            if param.name == "request_timeout":
                _check_timeout(ctx, param, value)
            if param.name == "as_group":
                opts.as_group = tuple(dict.fromkeys([*opts.as_group, *value]))
            elif value not in (None, False):
                setattr(opts, param.name or "", value)
            return value

        opts = [
            click.option("--kubeconfig", default=None, expose_value=False, callback=remember,
                         help="Path of the kubeconfig (default: $KUBECONFIG or ~/.kube/config)."),
            click.option("--context", default=None, expose_value=False, callback=remember,
                         help="kubeconfig context to use (default: the current context)."),
            click.option("-n", "--namespace", default=None, expose_value=False, callback=remember,
                         help="Namespace (default: the kubeconfig context's)."),
            click.option("--as", "as_user", default=None, expose_value=False, callback=remember, metavar="USER",
                         help="Impersonate USER (the Impersonate-User header; needs the impersonate verb)."),
            click.option("--as-group", "as_group", multiple=True, expose_value=False, callback=remember,
                         metavar="GROUP", help="Impersonate GROUP too (repeatable; needs --as)."),
            click.option("--request-timeout", default=None, expose_value=False, callback=remember,
                         metavar="DURATION",
                         help="Give up on one API request after DURATION (1s, 2m, 1h; 0: never, the default)."),
        ]
        if all_namespaces:
            opts.append(click.option("-A", "--all-namespaces", is_flag=True, default=False, expose_value=False,
                                     callback=remember, help="Every namespace."))
        for o in reversed(opts):
            f = o(f)
        return f

    return decorate


def current_options() -> KubeOptions:
    ctx = click.get_current_context(silent=True)
    opts = ctx.find_object(KubeOptions) if ctx is not None else None
    return opts or KubeOptions()


def check_namespace_flags(opts: KubeOptions) -> None:
    if opts.namespace and opts.all_namespaces:
        raise click.UsageError("-n/--namespace and -A/--all-namespaces are exclusive")


def load_config(opts: KubeOptions) -> str:
    """Configure the kubernetes client (kubeconfig first, in-cluster fallback). Returns the default
    namespace: ``-n``, else the context's namespace, else ``default``. A ``KUBECONFIG`` list
    (``a:b``) is merged as kubectl merges it; files of the list that do not exist are skipped, as
    kubectl skips them, unless none exists."""
    from kubernetes import config

    if opts.as_group and not opts.as_user:
        raise click.UsageError("--as-group needs --as (the user to impersonate)")
    namespace = "default"
    path = opts.kubeconfig or os.environ.get("KUBECONFIG") or None
    explicit = bool(opts.kubeconfig or opts.context)
    if path:
        files = [f for f in path.split(os.pathsep) if f]
        present = [f for f in files if os.path.exists(os.path.expanduser(f))]
        if not present:
            raise CLIError(f"kubeconfig {path} does not exist (from {'--kubeconfig' if opts.kubeconfig else 'KUBECONFIG'})",
                           ExitCode.USAGE)
        path = os.pathsep.join(present)
    context = opts.context or (_first_current_context(path.split(os.pathsep)) if path else None)
    try:
        config.load_kube_config(config_file=path, context=context)
        try:
            contexts, active = config.list_kube_config_contexts(config_file=path)
            if context:
                active = next((c for c in contexts if c.get("name") == context), active)
            namespace = (active or {}).get("context", {}).get("namespace") or "default"
        except config.ConfigException:
            pass
    except (config.ConfigException, OSError, TypeError) as e:
        if explicit:
            raise CLIError(f"cannot use the kubeconfig{' ' + path if path else ''}"
                           f"{' context ' + opts.context if opts.context else ''}: {_first(e)}") from None
        try:
            config.load_incluster_config()
        except config.ConfigException:
            raise CLIError("no Kubernetes configuration: no kubeconfig (set KUBECONFIG or --kubeconfig) and not "
                           "running in a cluster") from None
        try:
            with open(SA_NAMESPACE_FILE) as fh:
                namespace = fh.read().strip() or "default"
        except OSError:
            pass
    _fail_fast()
    _configure_client(opts)
    return opts.namespace or namespace


def _first_current_context(files: list[str]) -> str | None:
    """kubectl's rule for a KUBECONFIG list: the first file that sets current-context names it (the
    kubernetes client's merger would take the last)."""
    import yaml

    if len(files) < 2:
        return None
    for f in files:
        try:
            with open(os.path.expanduser(f)) as fh:
                doc = yaml.safe_load(fh)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict) and doc.get("current-context"):
            return str(doc["current-context"])
    return None


def _fail_fast() -> None:
    """One retry on connection errors (urllib3 would make 3, with backoff): an API server that is
    not there is reported in about a second, not three."""
    from kubernetes import client

    c = client.Configuration.get_default_copy()
    c.retries = 1
    client.Configuration.set_default(c)


_CLIENT: dict[str, Any] = {}


def _configure_client(opts: KubeOptions) -> None:
    """Build the one ApiClient every API object of this process uses (:func:`api_client`):
    impersonation headers (``--as``, ``--as-group``, as kubectl sends them) and the request timeout."""
    from kubernetes import client

    timeout = opts.timeout_seconds()

    class Client(client.ApiClient):
        def call_api(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("_request_timeout") is None and timeout:
                kwargs["_request_timeout"] = timeout
            return super().call_api(*args, **kwargs)

    api = Client()
    if opts.as_user:
        api.default_headers["Impersonate-User"] = opts.as_user
        # one header line per group (the API server reads every Impersonate-Group line; a comma is
        # part of a group's name): the headers dict has distinct keys, HTTP header names are not
        # case-sensitive, so each group gets its own spelling of the name
        for i, group in enumerate(opts.as_group):
            api.default_headers[_spelling("Impersonate-Group", i)] = group
    _CLIENT["api"] = api
    _CLIENT["timeout"] = timeout


def _spelling(name: str, i: int) -> str:
    """The ``i``-th case variant of ``name`` (0: as given): distinct dict keys, one HTTP header."""
    letters = [j for j, c in enumerate(name) if c.isalpha()]
    if i >= 2 ** len(letters):
        raise click.UsageError(f"at most {2 ** len(letters)} --as-group flags")
    chars = list(name)
    for bit, j in enumerate(letters):
        if i >> bit & 1:
            chars[j] = chars[j].swapcase()
    return "".join(chars)


def api_client() -> Any:
    """The ApiClient configured by :func:`load_config` (impersonation, request timeout)."""
    from kubernetes import client

    return _CLIENT.get("api") or client.ApiClient()


def request_timeout() -> float | None:
    """``--request-timeout`` in seconds, for calls that set their own (watches, log streams)."""
    timeout: float | None = _CLIENT.get("timeout")
    return timeout


def connect(opts: KubeOptions | None = None) -> tuple[Any, str]:
    """A CustomObjectsApi and the namespace to use (``-n`` or the context's)."""
    from kubernetes import client

    opts = opts or current_options()
    ns = load_config(opts)
    return client.CustomObjectsApi(api_client()), ns


def core_api() -> Any:
    """A CoreV1Api on the configured client (call after :func:`connect`)."""
    from kubernetes import client

    return client.CoreV1Api(api_client())


def _first(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def api_error(e: Exception, what: str) -> CLIError:
    """One line for a failed API call (``what``: e.g. ``agentrun "x" in namespace "y"``)."""
    status = getattr(e, "status", None)
    if status == 404:
        return CLIError(f"{what} not found", ExitCode.NOT_FOUND)
    if status in (401, 403):
        return CLIError(f"{what}: forbidden ({status} {getattr(e, 'reason', '')}) for the kubeconfig's user".strip(),
                        ExitCode.FORBIDDEN)
    if status == 409:
        return CLIError(f"{what}: conflict (409): it changed meanwhile; read it again", ExitCode.CONFLICT)
    if status:
        return CLIError(f"{what}: {status} {getattr(e, 'reason', '') or ''}".strip())
    return unreachable(e)


def status_code(status: int | None) -> ExitCode:
    """The exit code of an HTTP status the API server answered."""
    return {404: ExitCode.NOT_FOUND, 401: ExitCode.FORBIDDEN, 403: ExitCode.FORBIDDEN,
            409: ExitCode.CONFLICT}.get(status or 0, ExitCode.ERROR)


def unreachable(e: BaseException) -> CLIError:
    from kubernetes import client

    host = getattr(client.Configuration.get_default_copy(), "host", "") or "the API server"
    if _is_timeout(e):
        timeout = request_timeout()
        return CLIError(f"the Kubernetes API server at {host} did not answer in time"
                        + (f" (--request-timeout {timeout:g}s)" if timeout else ""), ExitCode.TIMEOUT)
    return CLIError(f"cannot reach the Kubernetes API server at {host}: {_reason(e)}", ExitCode.UNREACHABLE)


def _is_timeout(e: BaseException) -> bool:
    import socket

    import urllib3.exceptions as u3

    seen: BaseException | None = e
    for _ in range(5):
        if seen is None:
            break
        if isinstance(seen, u3.NewConnectionError):  # a subclass of ConnectTimeoutError, but refused
            return False
        if isinstance(seen, (u3.TimeoutError, socket.timeout, TimeoutError)):
            return True
        seen = getattr(seen, "reason", None) if isinstance(getattr(seen, "reason", None), BaseException) else None
    return False


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None)
    while reason is not None and getattr(reason, "reason", None) is not None and reason is not reason.reason:
        reason = reason.reason
    text = str(reason if reason is not None else e)
    if "Connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return "timed out"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    return _first(reason if isinstance(reason, BaseException) else e)


def get_run(api: Any, namespace: str, name: str) -> dict[str, Any]:
    """The AgentRun, or ``agentrun: agentrun "NAME" not found in namespace "NS"``."""
    from kubernetes.client.exceptions import ApiException

    try:
        run: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return run
    except ApiException as e:
        if e.status == 404:
            raise CLIError(f'agentrun "{name}" not found in namespace "{namespace}"', ExitCode.NOT_FOUND) from None
        raise api_error(e, f'agentrun "{name}" in namespace "{namespace}"') from None
    except Exception as e:  # urllib3 / socket errors: the API server is unreachable
        raise unreachable(e) from None


def list_runs(api: Any, namespace: str | None) -> list[dict[str, Any]]:
    """AgentRuns of one namespace, or of all (``namespace`` None)."""
    from kubernetes.client.exceptions import ApiException

    try:
        if namespace is None:
            doc = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        else:
            doc = api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        items: list[dict[str, Any]] = doc["items"]
        return items
    except ApiException as e:
        raise api_error(e, "list agentruns" + (f' in namespace "{namespace}"' if namespace else "")) from None
    except Exception as e:
        raise unreachable(e) from None


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion of a RUN argument: the names of the AgentRuns of the namespace (``-n`` or
    the context's), asked with a 2-second timeout; nothing (silently) when the cluster cannot answer."""
    from click.shell_completion import CompletionItem

    try:
        opts = ctx.find_object(KubeOptions) or KubeOptions()
        opts.request_timeout = opts.request_timeout or "2s"
        api, ns = connect(opts)
        names = sorted((r.get("metadata") or {}).get("name", "") for r in list_runs(api, ns))
    except Exception:
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]
