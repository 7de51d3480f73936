"""``agentrun run AGENT -p key=value [--wait]``: submit a run of an Agent (``spec.agentRef``) with
its parameters. The parameters are checked against the Agent here first (the operator checks
them again, against the copy it pins), so a typo fails at once, naming ``-p KEY``. ``run_body``
and ``parse_params`` are pure."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import click
import yaml

from agentrun.api.agent import AgentDefinitionSpec, ResolveError, check_parameters, render_task
from agentrun.api.crdgen import AGENT_PLURAL, GROUP, KIND, PLURAL, VERSION
from agentrun.api.spec import PARAMETER_NAME_PATTERN
from agentrun.cli.exitcodes import ExitCode
from agentrun.cli.kube import CLIError, api_error, connect, current_options, get_run, kube_options, unreachable
from agentrun.cli.lifecycle import summary, wait_result
from agentrun.cli.output import parse_duration, run_name

NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def parse_params(values: tuple[str, ...]) -> dict[str, str]:
    """``-p key=value`` options as a map; a bad one or a repeated key is a usage error naming it."""
    out: dict[str, str] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not re.match(PARAMETER_NAME_PATTERN, key):
            raise click.BadParameter(f"{raw[:80]!r} is not KEY=VALUE with KEY a parameter name "
                                     "(letters, digits, _)", param_hint="-p")
        if key in out:
            raise click.BadParameter(f"{key} is given twice", param_hint="-p")
        out[key] = value
    return out


def run_body(agent: str, params: dict[str, str], name: str | None, task: str | None) -> dict[str, Any]:
    """The AgentRun to create: ``spec.agentRef`` and ``spec.parameters`` (and ``spec.task`` when
    given); named ``name``, else ``AGENT-<random>`` (``metadata.generateName``)."""
    meta: dict[str, Any] = {"name": name} if name else {"generateName": f"{agent[:57]}-"}
    spec: dict[str, Any] = {"agentRef": {"name": agent}}
    if params:
        spec["parameters"] = dict(params)
    if task is not None:
        spec["task"] = task
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": meta, "spec": spec}


def check_against(agent: str, doc: dict[str, Any], params: dict[str, str], task: str | None) -> None:
    """The parameters (and task template) against the Agent as the API server has it now."""
    try:
        definition = AgentDefinitionSpec.model_validate(doc.get("spec") or {})
    except ValueError:
        return  # the operator says what is wrong with the Agent (condition AgentInvalid)
    try:
        _, text = check_parameters(agent, definition.parameters, params)
        template = task if task is not None else definition.task
        if template is None:
            raise click.BadParameter(f"Agent {agent} has no spec.task: give one", param_hint="--task")
        render_task(template, text, [p.name for p in definition.parameters])
    except ResolveError as e:
        raise click.BadParameter(e.problem.message, param_hint="-p") from None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--task") from None


@click.command("run", short_help="Submit a run of AGENT (an Agent of the namespace) with parameters.")
@click.argument("agent")
@kube_options()
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A parameter of the Agent (repeatable); integer, number and boolean values are parsed as such.")
@click.option("--name", default=None, help="Name of the AgentRun (default: AGENT-<random>, --generate-name).")
@click.option("--generate-name", is_flag=True, help="Name it AGENT-<random> (the default without --name).")
@click.option("--task", default=None, help="The task (a template over the parameters); default: the Agent's spec.task.")
@click.option("--wait", is_flag=True, help="Wait until the run ends and exit by its outcome, like `agentrun wait`.")
@click.option("--timeout", default=None, metavar="DURATION", help="With --wait: give up after DURATION (exit 7).")
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml", "name"]), default="text",
              show_default=True, help="text (one line), the created AgentRun as JSON/YAML, or name.")
def run_command(agent: str, params: tuple[str, ...], name: str | None, generate_name: bool, task: str | None,
                wait: bool, timeout: str | None, output: str) -> None:
    """Create an AgentRun of AGENT (spec.agentRef) with -p KEY=VALUE parameters. They are checked
    against the Agent first (missing, undeclared or ill-typed: exit 2 naming the parameter). The
    operator pins the Agent's definition at the run's first lap (status.agent). With --wait, wait
    until the run ends and exit by its outcome: 0 Succeeded, 10 Failed, 11 BudgetExceeded,
    12 Cancelled, 13 DeadlineExceeded, 7 when --timeout passes first."""
    from kubernetes.client.exceptions import ApiException

    if name is not None and generate_name:
        raise click.UsageError("--name and --generate-name are exclusive")
    if name is not None and (not NAME.match(name) or len(name) > 253):
        raise click.BadParameter(f"{name!r} is not a valid object name (lower-case DNS subdomain)", param_hint="--name")
    if not NAME.match(agent) or len(agent) > 253:
        raise click.BadParameter(f"{agent!r} is not a valid object name", param_hint="AGENT")
    limit = None
    if timeout is not None:
        try:
            limit = parse_duration(timeout)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--timeout") from None
    values = parse_params(params)
    api, ns = connect(current_options())
    try:
        doc = api.get_namespaced_custom_object(GROUP, VERSION, ns, AGENT_PLURAL, agent)
    except ApiException as e:
        if e.status == 404:
            raise CLIError(f'agent "{agent}" not found in namespace "{ns}"', ExitCode.NOT_FOUND) from None
        raise api_error(e, f'agent "{agent}" in namespace "{ns}"') from None
    except Exception as e:
        raise unreachable(e) from None
    check_against(agent, doc, values, task)
    try:
        created = api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, run_body(agent, values, name, task))
    except ApiException as e:
        if e.status == 409:
            raise CLIError(f'agentrun "{name}" already exists in namespace "{ns}"', ExitCode.CONFLICT) from None
        raise api_error(e, f'create a run of agent "{agent}" in namespace "{ns}"') from None
    except Exception as e:
        raise unreachable(e) from None
    new = created["metadata"]["name"]
    if output == "json":
        click.echo(json.dumps(created, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(created, sort_keys=False), nl=False)
    elif output == "name":
        click.echo(run_name(new))
    else:
        click.echo(f"agentrun {ns}/{new} created: runs agent {agent}")
    if not wait:
        return
    ends = time.monotonic() + limit if limit is not None else None
    while True:
        obj = get_run(api, ns, new)
        code = wait_result(obj, None)
        if code is not None:
            if output == "text":
                click.echo(summary(obj))
            raise SystemExit(int(code))
        if ends is not None and time.monotonic() >= ends:
            phase = (obj.get("status") or {}).get("phase") or "Pending"
            raise CLIError(f"timed out after {timeout} waiting for agentrun {ns}/{new} to end (phase {phase})",
                           ExitCode.TIMEOUT)
        time.sleep(min(2.0, max(0.0, ends - time.monotonic())) if ends is not None else 2.0)
