"""Cluster access for the ``agentrun`` commands: kubectl-like flags, one-line errors.

Every cluster-facing command takes ``--kubeconfig``, ``--context``, ``-n/--namespace`` (and the
listing ones ``-A/--all-namespaces``) through :func:`kube_options`. The default namespace is the
kubeconfig context's, like kubectl (in a pod: the service account's). The options are kept in the
click context (``KubeOptions``), so helpers deep in a command find them without threading them
through every call.

Errors are :class:`CLIError`: printed as one line ``agentrun: <message>`` with exit code 1, never a
traceback (``main.LazyGroup`` also turns an unexpected API/network error into one line).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import click

from agentrun.api.crdgen import GROUP, PLURAL, VERSION

F = TypeVar("F", bound=Callable[..., Any])
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class CLIError(click.ClickException):
    """A one-line error: ``agentrun: <message>`` on stderr, exit code 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"agentrun: {self.format_message()}", err=True, file=file)


@dataclass
class KubeOptions:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False


def kube_options(all_namespaces: bool = False) -> Callable[[F], F]:
    """The kubectl-like flags of a cluster-facing command. They are also kept, merged with any
    given on a parent group, in ``ctx.find_object(KubeOptions)``."""

    def decorate(f: F) -> F:
        def remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
            opts = ctx.find_object(KubeOptions)
            if opts is None:
                opts = ctx.ensure_object(KubeOptions)
            if value not in (None, False):
                setattr(opts, param.name or "", value)
            return value

        opts = [
            click.option("--kubeconfig", default=None, expose_value=False, callback=remember,
                         help="Path of the kubeconfig (default: $KUBECONFIG or ~/.kube/config)."),
            click.option("--context", default=None, expose_value=False, callback=remember,
                         help="kubeconfig context to use (default: the current context)."),
            click.option("-n", "--namespace", default=None, expose_value=False, callback=remember,
                         help="Namespace (default: the kubeconfig context's)."),
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
    namespace: ``-n``, else the context's namespace, else ``default``."""
    from kubernetes import config

    namespace = "default"
    path = opts.kubeconfig or os.environ.get("KUBECONFIG") or None
    if path and ":" in path:  # like kubectl, the first file of a KUBECONFIG list
        path = path.split(":")[0]
    explicit = bool(opts.kubeconfig or opts.context)
    if path and not os.path.exists(os.path.expanduser(path)):
        raise CLIError(f"kubeconfig {path} does not exist (from {'--kubeconfig' if opts.kubeconfig else 'KUBECONFIG'})")
    try:
        config.load_kube_config(config_file=path, context=opts.context)
        try:
            _, active = config.list_kube_config_contexts(config_file=path)
            if opts.context:
                contexts, _ = config.list_kube_config_contexts(config_file=path)
                active = next((c for c in contexts if c.get("name") == opts.context), active)
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
    return opts.namespace or namespace


def _fail_fast() -> None:
    """One retry on connection errors (urllib3 would make 3, with backoff): an API server that is
    not there is reported in about a second, not three."""
    from kubernetes import client

    c = client.Configuration.get_default_copy()
    c.retries = 1
    client.Configuration.set_default(c)


def connect(opts: KubeOptions | None = None) -> tuple[Any, str]:
    """A CustomObjectsApi and the namespace to use (``-n`` or the context's)."""
    from kubernetes import client

    opts = opts or current_options()
    ns = load_config(opts)
    return client.CustomObjectsApi(), ns


def _first(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def api_error(e: Exception, what: str) -> CLIError:
    """One line for a failed API call (``what``: e.g. ``agentrun "x" in namespace "y"``)."""
    status = getattr(e, "status", None)
    if status == 404:
        return CLIError(f"{what} not found")
    if status in (401, 403):
        return CLIError(f"{what}: forbidden ({status} {getattr(e, 'reason', '')}) for the kubeconfig's user".strip())
    if status:
        return CLIError(f"{what}: {status} {getattr(e, 'reason', '') or ''}".strip())
    return unreachable(e)


def unreachable(e: BaseException) -> CLIError:
    from kubernetes import client

    host = getattr(client.Configuration.get_default_copy(), "host", "") or "the API server"
    return CLIError(f"cannot reach the Kubernetes API server at {host}: {_reason(e)}")


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
            raise CLIError(f'agentrun "{name}" not found in namespace "{namespace}"') from None
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
