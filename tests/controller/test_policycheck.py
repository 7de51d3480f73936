"""The operator's check of its admission policies (controller/policycheck.py): what it requires,
how it judges what the API server returns (missing, outdated, tampered, not served), how it reads
(one discovery GET, then a list and a watch of each object by name, against a real HTTP server), and
its state (readiness at once on a watch event, recovery, refusals)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.api import admission, policy_version, tenancy_admission
from agentrun.controller.config import OperatorConfig
from agentrun.controller.policycheck import (
    GROUP_VERSION,
    MIN_WATCH_SECONDS,
    NOT_SERVED,
    RESOURCES,
    PolicyCheck,
    verdict,
    wanted,
)
from agentrun.kube.client import Client

ROOT = Path(__file__).resolve().parents[2]
ALL = ("approvals", "stamping", "tenancy")


def _stored(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as the API server returns it: with server-side defaults and metadata added."""
    out = copy.deepcopy(doc)
    out["metadata"].update({"uid": "u", "resourceVersion": "7", "generation": 1})
    spec = out["spec"]
    if "matchConstraints" in spec:
        spec["matchConstraints"].update({"matchPolicy": "Equivalent", "namespaceSelector": {}, "objectSelector": {}})
        for rule in spec["matchConstraints"]["resourceRules"]:
            rule["scope"] = "*"
    if out["kind"].endswith("Binding"):
        spec.setdefault("matchResources", {}).update({"matchPolicy": "Equivalent", "objectSelector": {}})
    return out


def _installed(files: tuple[str, ...] = ("agentrun.dev_admission-policies.yaml", "agentrun.dev_admission-mutating.yaml",
                                          "agentrun.dev_tenancy-policy.yaml")) -> dict[tuple[str, str], Any]:
    """What `kubectl apply -f crds/...` leaves in the cluster (the generated files, as committed)."""
    got: dict[tuple[str, str], Any] = {}
    for f in files:
        for doc in yaml.safe_load_all((ROOT / "crds" / f).read_text()):
            if doc:
                got[(doc["kind"], doc["metadata"]["name"])] = _stored(doc)
    return got


def test_the_committed_files_carry_the_marker_the_code_computes():
    wants = wanted(ALL)
    assert sorted((w.set, w.kind, w.name) for w in wants) == sorted([
        *(("approvals", k, n) for n in (admission.VAP_DECISIONS, admission.VAP_STATUS, admission.VAP_GUARD,
                                             admission.VAP_LIFECYCLE, admission.VAP_AGENT_GUARD)
          for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")),
        *(("stamping", k, n) for n in (admission.MAP_ANNOTATION, admission.MAP_STATUS, admission.MAP_CREATOR,
                                            admission.MAP_RETRY, admission.MAP_CANCEL)
          for k in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")),
        ("tenancy", "ValidatingAdmissionPolicy", "agentrun-tenancy"),
        ("tenancy", "ValidatingAdmissionPolicyBinding", "agentrun-tenancy"),
    ])
    got = _installed()
    for w in wants:
        ann = got[(w.kind, w.name)]["metadata"]["annotations"]
        if w.marker is not None:
            assert ann[policy_version.ANNOTATION] == w.marker, f"{w.name}: run `make crds && make helm-crds`"
    assert verdict(wants, got) is None


def test_the_marker_is_the_sha256_of_the_spec_and_changes_with_any_rule():
    doc = admission.decisions_policy()
    m = policy_version.marker(doc)
    assert len(m) == 64 and m == policy_version.stamp(copy.deepcopy(doc))["metadata"]["annotations"][
        policy_version.ANNOTATION]
    doc["spec"]["validations"][0]["expression"] += " || true"
    assert policy_version.marker(doc) != m
    # labels and annotations do not count (the chart adds its own)
    doc2 = admission.decisions_policy()
    doc2["metadata"]["labels"]["helm.sh/chart"] = "x"
    assert policy_version.marker(doc2) == m


def test_a_missing_binding_is_named():
    got = _installed()
    del got[("ValidatingAdmissionPolicyBinding", admission.VAP_DECISIONS)]
    p = verdict(wanted(ALL), got)
    assert p is not None and p.reason == "AdmissionPoliciesMissing"
    assert "missing: ValidatingAdmissionPolicyBinding agentrun-decisions" in p.message
    assert "docs/operations.md#admission-policies" in p.message


def test_an_older_policy_is_outdated_with_both_versions_shown():
    got = _installed()
    old = got[("ValidatingAdmissionPolicy", admission.VAP_STATUS)]
    old["metadata"]["annotations"][policy_version.ANNOTATION] = "0123456789abcdef" * 4
    del got[("MutatingAdmissionPolicy", admission.MAP_STATUS)]["metadata"]["annotations"][policy_version.ANNOTATION]
    p = verdict(wanted(ALL), got)
    assert p is not None and p.reason == "AdmissionPoliciesOutdated"
    want = policy_version.marker(admission.status_policy())
    assert f"ValidatingAdmissionPolicy agentrun-status-owner (version 0123456789abcde…, this operator expects {want[:12]})" \
        in p.message, p.message
    assert "MutatingAdmissionPolicy agentrun-stamp-decider-status (version none" in p.message


def test_a_changed_spec_under_the_current_marker_is_outdated_naming_the_field():
    got = _installed()
    got[("ValidatingAdmissionPolicyBinding", admission.VAP_DECISIONS)]["spec"]["validationActions"] = ["Audit"]
    p = verdict(wanted(ALL), got)
    assert p is not None and p.reason == "AdmissionPoliciesOutdated"
    assert "ValidatingAdmissionPolicyBinding agentrun-decisions (spec.validationActions[0] is not what" in p.message
    got = _installed()
    got[("ValidatingAdmissionPolicy", "agentrun-tenancy")]["spec"]["failurePolicy"] = "Ignore"
    p = verdict(wanted(ALL), got)
    assert p is not None and "spec.failurePolicy" in p.message


def test_the_operator_name_the_chart_writes_per_release_is_not_a_difference():
    got = _installed()
    policies = [(k, n) for (k, n), o in got.items() if k == "ValidatingAdmissionPolicy"
                and any(v["name"] == admission.OPERATOR_USERNAMES_VAR for v in o["spec"].get("variables") or [])]
    assert policies  # the chart sets it in these (templates/admission-policies.yaml)
    for key in policies:
        for v in got[key]["spec"]["variables"]:
            if v["name"] == admission.OPERATOR_USERNAMES_VAR:
                v["expression"] = '["system:serviceaccount:agentrun-system:agentrun-operator"]'
    assert verdict(wanted(ALL), got) is None
    for bad in ('["system:serviceaccount:a:b", "mallory"]', "true", '["mallory"]'):
        for v in got[policies[0]]["spec"]["variables"]:
            if v["name"] == admission.OPERATOR_USERNAMES_VAR:
                v["expression"] = bad
        p = verdict(wanted(ALL), got)
        assert p is not None and p.reason == "AdmissionPoliciesOutdated" and ".expression is not what" in p.message, bad


def test_the_charts_tenancy_binding_is_checked_by_its_fields_not_a_marker():
    got = _installed()
    chart_binding = got[("ValidatingAdmissionPolicyBinding", "agentrun-tenancy")]
    del chart_binding["metadata"]["annotations"][policy_version.ANNOTATION]
    chart_binding["spec"]["matchResources"]["namespaceSelector"] = {"matchExpressions": [
        {"key": "agentrun.dev/tenancy-policy", "operator": "NotIn", "values": ["team-a"]}]}
    assert verdict(wanted(ALL), got) is None
    chart_binding["spec"]["paramRef"]["parameterNotFoundAction"] = "Allow"
    p = verdict(wanted(ALL), got)
    assert p is not None and "spec.paramRef.parameterNotFoundAction" in p.message


def test_stamping_is_required_only_where_served_the_validating_ones_always():
    got = _installed()
    for (kind, name) in list(got):
        if kind.startswith("Mutating"):
            got[(kind, name)] = NOT_SERVED
    assert verdict(wanted(ALL), got) is None
    got[("ValidatingAdmissionPolicy", admission.VAP_DECISIONS)] = NOT_SERVED
    p = verdict(wanted(ALL), got)
    assert p is not None and p.reason == "AdmissionPoliciesMissing"
    assert "the API server does not serve ValidatingAdmissionPolicy" in p.message
    # only what is required counts
    assert verdict(wanted(("stamping",)), _installed()) is None
    assert verdict(wanted(()), {}) is None


def test_a_bad_policy_set_name_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match="AGENTRUN_ADMISSION_POLICIES: unknown policy set tenancies"):
        OperatorConfig.from_env({"AGENTRUN_ADMISSION_POLICIES": "approvals,tenancies"})
    cfg = OperatorConfig.from_env({"AGENTRUN_ADMISSION_POLICIES": " approvals , tenancy",
                                   "AGENTRUN_ALLOW_MISSING_POLICIES": "true"})
    assert cfg.admission_policies == ("approvals", "tenancy") and cfg.allow_missing_policies
    cfg = OperatorConfig.from_env({})
    assert cfg.admission_policies == ALL and not cfg.allow_missing_policies


class FakeApiServer:
    """The API server's admissionregistration.k8s.io/v1 over HTTP on loopback (aiohttp): discovery
    (``served``), the list of one object by ``fieldSelector=metadata.name`` and its watch, whose
    events the test sends (:meth:`send`). ``requests`` records (verb, resource, name) of each
    request; ``refuse`` answers the lists and watches of the resources in it with a 403."""

    def __init__(self, objects: dict[tuple[str, str], Any], served: set[str] | None = None) -> None:
        self.objects = objects
        self.served = set(RESOURCES.values()) if served is None else served
        self.requests: list[tuple[str, str, str]] = []
        self.refuse: set[str] = set()
        self.watches: dict[tuple[str, str], asyncio.Queue[dict[str, Any] | None]] = {}
        self.runner: Any = None
        self.closing = False

    async def handle(self, request: Any) -> Any:
        from aiohttp import web

        if request.path == GROUP_VERSION:
            self.requests.append(("discovery", "", ""))
            return web.json_response({"kind": "APIResourceList", "resources": [{"name": r} for r in sorted(self.served)]})
        resource = request.path[len(GROUP_VERSION) + 1:]
        field = request.query.get("fieldSelector", "")
        assert field.startswith("metadata.name="), request.url  # by name: what RBAC's resourceNames can grant
        name = field[len("metadata.name="):]
        kind = next(k for k, r in RESOURCES.items() if r == resource)
        watch = request.query.get("watch") == "true"
        self.requests.append(("watch" if watch else "list", resource, name))
        if resource in self.refuse:
            return web.json_response({"kind": "Status", "code": 403, "message": "forbidden"}, status=403)
        if not watch:
            obj = self.objects.get((kind, name))
            return web.json_response({"metadata": {"resourceVersion": "10"}, "items": [obj] if obj else []})
        resp = web.StreamResponse()
        await resp.prepare(request)
        queue = self.watches.setdefault((kind, name), asyncio.Queue())
        while not self.closing and (ev := await queue.get()) is not None:
            await resp.write(json.dumps(ev).encode() + b"\n")
        return resp

    async def start(self) -> Client:
        from aiohttp import web
        from kubernetes.client import ApiClient, Configuration

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return Client(ApiClient(Configuration(host=f"http://127.0.0.1:{port}")), 64)

    def send(self, kind: str, name: str, type_: str, obj: dict[str, Any]) -> None:
        self.watches.setdefault((kind, name), asyncio.Queue()).put_nowait({"type": type_, "object": obj})

    async def stop(self, client: Client) -> None:
        self.closing = True
        for q in self.watches.values():
            q.put_nowait(None)
        await client.close()
        await self.runner.cleanup()


async def _until(check: Any, seconds: float = 20.0) -> None:
    """Wait (a bound, not a measurement) until ``check()`` is true."""
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within the bound")


def test_it_lists_and_watches_each_object_by_name_and_skips_kinds_not_served():
    api = FakeApiServer(_installed(), served={"validatingadmissionpolicies", "validatingadmissionpolicybindings"})

    async def main() -> None:
        client = await api.start()
        check = PolicyCheck(ALL, False, client, watch_seconds=60)
        task = asyncio.create_task(check.run(3600))
        try:
            await _until(lambda: check.checked.is_set())
            validating = [w for w in check.wants if w.set != "stamping"]
            await _until(lambda: len([r for r in api.requests if r[0] == "watch"]) == len(validating))
            assert api.requests[0] == ("discovery", "", "")
            assert sorted(r for r in api.requests if r[0] == "list") == sorted(
                ("list", RESOURCES[w.kind], w.name) for w in validating)  # no mutating one asked for
            assert all(check.got[(w.kind, w.name)] is NOT_SERVED for w in check.wants if w.set == "stamping")
            assert check.ready and check.blocking is None
            # an absent or unchanged object costs one watch per MIN_WATCH_SECONDS, not per watch cache timeout
            assert check.informers and all(i.watch_seconds == MIN_WATCH_SECONDS for i in check.informers)
        finally:
            task.cancel()
            await api.stop(client)

    asyncio.run(main())


def test_a_deletion_on_the_watch_makes_it_unready_at_once_and_its_return_ready_again_without_a_request():
    api = FakeApiServer(_installed())
    changes: list[int] = []

    async def main() -> None:
        client = await api.start()
        check = PolicyCheck(ALL, False, client, on_change=lambda: changes.append(1), watch_seconds=60)
        assert not check.ready and check.blocking is not None  # not checked yet: no lap
        task = asyncio.create_task(check.run(3600))  # no resync within the test: only the watch can tell
        try:
            await _until(lambda: check.ready)
            await _until(lambda: len([r for r in api.requests if r[0] == "watch"]) == len(check.wants))
            made = len(api.requests)
            key = ("ValidatingAdmissionPolicyBinding", admission.VAP_DECISIONS)
            binding = api.objects[key]
            api.send(*key, "DELETED", binding)
            await _until(lambda: not check.ready)
            p = check.blocking
            assert p is not None and p.reason == "AdmissionPoliciesMissing"
            assert f"missing: ValidatingAdmissionPolicyBinding {admission.VAP_DECISIONS}" in p.message
            assert changes == [1]
            # edited: the version marker of another release
            pkey = ("ValidatingAdmissionPolicy", admission.VAP_STATUS)
            edited = copy.deepcopy(api.objects[pkey])
            edited["metadata"]["annotations"][policy_version.ANNOTATION] = "0" * 64
            api.send(*pkey, "MODIFIED", edited)
            await _until(lambda: "outdated" in (check.blocking.message if check.blocking else ""))
            api.send(*pkey, "MODIFIED", api.objects[pkey])
            api.send(*key, "ADDED", binding)
            await _until(lambda: check.ready)
            # missing; missing and outdated; missing; in place: each verdict queued the runs again
            assert changes == [1, 1, 1, 1] and len(api.requests) == made  # the watch told it all: no GET
        finally:
            task.cancel()
            await api.stop(client)

    asyncio.run(main())


def test_a_refused_list_blocks_naming_the_reader_role_and_allow_missing_lets_laps_start():
    api = FakeApiServer(_installed())
    api.refuse = {"validatingadmissionpolicybindings"}

    async def main() -> None:
        client = await api.start()
        check = PolicyCheck(ALL, False, client, watch_seconds=60)
        task = asyncio.create_task(check.run(3600))
        lax = PolicyCheck(ALL, True, client, watch_seconds=60)
        lax_task = asyncio.create_task(lax.run(3600))
        try:
            await _until(lambda: check.checked.is_set() and lax.checked.is_set())
            p = check.blocking
            assert p is not None and p.reason == "AdmissionPoliciesUnknown" and "HTTP 403" in p.message
            assert "admission-reader" in p.message and "list and watch" in p.message and not check.ready
            assert lax.ready and lax.blocking is None  # allowed: laps start (logged as a warning)
        finally:
            task.cancel()
            lax_task.cancel()
            await api.stop(client)

    asyncio.run(main())


def test_an_unanswered_discovery_blocks_until_it_answers():
    async def main() -> None:
        import socket

        from kubernetes.client import ApiClient, Configuration
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]  # nothing listens there
        client = Client(ApiClient(Configuration(host=f"http://127.0.0.1:{port}")))
        check = PolicyCheck(ALL, False, client)
        task = asyncio.create_task(check.run(3600))
        try:
            await _until(lambda: check.checked.is_set())
            p = check.blocking
            assert p is not None and p.reason == "AdmissionPoliciesUnknown" and not check.ready
            assert "admissionregistration.k8s.io/v1 API" in p.message
        finally:
            task.cancel()
            await client.close()

    asyncio.run(main())


def test_the_tenancy_generator_stamps_what_the_check_expects():
    policy, binding = tenancy_admission.policy_documents()
    assert policy["metadata"]["annotations"][policy_version.ANNOTATION] == policy_version.marker(policy)
    assert binding["metadata"]["annotations"][policy_version.ANNOTATION] == policy_version.marker(binding)
