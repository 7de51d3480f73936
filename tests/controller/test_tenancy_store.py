"""The tenancy re-check's watched state (agentrun.controller.tenancy.PolicyStore): the events of the
namespaces, admission bindings and AgentRunPolicies informers give the same policies per namespace
as the API server picks, a change names the namespaces whose runs must be checked again, and a
refused watch makes the re-check say it is not enforced. Pure: no cluster, no requests."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api.tenancy import NAMESPACE_LABEL, VAP_NAME
from agentrun.controller.tenancy import PolicyStore

SPEC = {"agent": {"model": {"baseURL": "https://api.example.com/v1"}}}


def ns_obj(name: str, rv: int, team: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv), "uid": f"u-{name}",
                         "labels": {NAMESPACE_LABEL: team} if team else {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


def binding(name: str, rv: int, policy: str, selector: dict[str, Any], vap: str = VAP_NAME) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv)},
            "spec": {"policyName": vap, "paramRef": {"name": policy}, "validationActions": ["Deny"],
                     "matchResources": {"namespaceSelector": selector}}}


def policy(name: str, rv: int, hosts: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv), "managedFields": [{"manager": "kubectl"}]},
            "spec": {"destinations": {"allowedHosts": hosts}}}


@pytest.fixture
def store() -> tuple[PolicyStore, list[set[str] | None]]:
    changes: list[set[str] | None] = []
    s = PolicyStore(on_change=changes.append)
    s.replace("namespaces", None, [ns_obj("a", 1), ns_obj("b", 2, team="strict")])
    s.replace("bindings", None, [
        binding("agentrun-tenancy", 3, "default", {"matchExpressions": [
            {"key": NAMESPACE_LABEL, "operator": "NotIn", "values": ["strict"]}]}),
        binding("agentrun-tenancy-strict", 4, "strict", {"matchLabels": {NAMESPACE_LABEL: "strict"}}),
        binding("someone-elses", 5, "default", {}, vap="other-policy"),
    ])
    s.replace("policies", None, [policy("default", 6, ["*"]), policy("strict", 7, ["*"])])
    changes.clear()
    return s, changes


def test_each_namespace_gets_the_policies_its_bindings_select(store):
    s, _ = store
    assert list(s.policies_for("a") or {}) == ["default"]
    assert list(s.policies_for("b") or {}) == ["strict"]
    assert (s.check("a", SPEC) or pytest.fail("not enforced")).ok
    assert s.namespaces["a"] == {"metadata": {"name": "a", "resourceVersion": "1",
                                              "labels": {"kubernetes.io/metadata.name": "a"}}}  # labels only
    assert "managedFields" not in s.policies["strict"]["metadata"]


def test_a_tightened_policy_is_checked_with_its_event_and_names_the_namespaces_it_applies_to(store):
    s, changes = store
    s.event("policies", "MODIFIED", policy("strict", 8, ["other.example.com"]))
    assert changes == [{"b"}]
    got = s.check("b", SPEC)
    assert got is not None and not got.ok and "destinations.allowedHosts" in got.message
    assert (s.check("a", SPEC) or pytest.fail("not enforced")).ok
    # a stale event (older version) changes nothing; an equal spec notifies nobody
    s.event("policies", "MODIFIED", policy("strict", 7, ["*"]))
    s.event("policies", "MODIFIED", policy("strict", 9, ["other.example.com"]))
    assert changes == [{"b"}] and not (s.check("b", SPEC) or pytest.fail("not enforced")).ok


def test_a_deleted_policy_refuses_everything_like_the_api_server(store):
    s, changes = store
    s.event("policies", "DELETED", policy("strict", 8, ["*"]))
    assert changes == [{"b"}]
    got = s.check("b", SPEC)
    assert got is not None and "does not exist" in got.message


def test_binding_and_label_changes_name_every_or_the_relabelled_namespace(store):
    s, changes = store
    s.event("namespaces", "MODIFIED", ns_obj("a", 10, team="strict"))  # a joins the strict team
    assert changes == [{"a"}] and list(s.policies_for("a") or {}) == ["strict"]
    s.event("namespaces", "MODIFIED", {**ns_obj("a", 11, team="strict"), "status": {"phase": "Terminating"}})
    assert changes == [{"a"}]  # the labels did not change
    s.event("bindings", "DELETED", binding("agentrun-tenancy-strict", 12, "strict", {}))
    assert changes == [{"a"}, None] and list(s.policies_for("b") or {}) == []
    s.event("bindings", "MODIFIED", binding("someone-elses", 13, "x", {}, vap="other-policy"))
    assert changes == [{"a"}, None]  # not a binding of agentrun-tenancy


def test_a_relist_reports_what_was_deleted_meanwhile(store):
    s, changes = store
    s.replace("policies", None, [policy("default", 6, ["*"])])
    assert changes == [{"b"}] and list(s.policies) == ["default"]


def test_a_refused_watch_means_not_enforced_until_a_list_succeeds(store):
    s, _ = store
    s.refused("bindings", 403)
    assert s.check("a", SPEC) is None and s.policies_for("b") is None
    s.replace("bindings", None, list(s.bindings.values()))
    assert s.refusals == {} and (s.check("a", SPEC) or pytest.fail("not enforced")).ok


def test_a_namespace_read_directly_is_kept_until_a_newer_event():
    s = PolicyStore()
    assert not s.knows("new")
    s.put_namespace(ns_obj("new", 5, team="strict"))
    assert s.knows("new")
    s.event("namespaces", "ADDED", ns_obj("new", 4))  # the lagging watch's older version
    assert s.namespaces["new"]["metadata"]["labels"] == {NAMESPACE_LABEL: "strict"}


def test_a_relist_of_one_namespace_watched_by_name_leaves_the_others():
    s = PolicyStore()
    s.replace("namespaces", "a", [ns_obj("a", 1)])
    s.replace("namespaces", "b", [ns_obj("b", 2, team="strict")])
    s.replace("namespaces", "a", [ns_obj("a", 3, team="strict")])
    assert sorted(s.namespaces) == ["a", "b"]
    s.replace("namespaces", "b", [])  # b deleted while its watch was expired
    assert sorted(s.namespaces) == ["a"]


def test_an_unreadable_policy_refuses_its_runs_naming_the_policy_and_field_instead_of_failing_reconciles(store):
    """A policy the API server stored but this operator cannot read (a field of a newer release,
    a value its models refuse) was a ValueError raised out of every reconcile of every run it
    applies to: retried with backoff for ever, no Event, no condition. Now the check refuses, like
    a missing policy, and the message names the policy and the field."""
    s, changes = store
    bad = policy("strict", 8, ["*"])
    bad["spec"]["destinations"]["schemes"] = ["ftp"]
    s.event("policies", "MODIFIED", bad)
    assert changes == [{"b"}]
    got = s.check("b", SPEC)
    assert got is not None and not got.ok
    assert "AgentRunPolicy strict cannot be read" in got.message and "spec.destinations.schemes" in got.message
    assert (s.check("a", SPEC) or pytest.fail("not enforced")).ok  # other namespaces keep their policy
    s.event("policies", "MODIFIED", policy("strict", 9, ["*"]))  # fixed: checked again
    assert (s.check("b", SPEC) or pytest.fail("not enforced")).ok


def test_a_refused_namespace_watched_by_name_concerns_only_its_own_runs(store):
    """With exact watched namespaces each is watched by name (RBAC by resourceNames). One refused
    name and another one listed shared a single "namespaces" refusal: the listed one's relist
    cleared it, the refused one's retry set it again, and the re-check flipped between enforced and
    not for every namespace (review finding 19)."""
    s, _ = store
    s.refused("namespaces", 403, "a")
    assert s.not_enforced("a") and s.check("a", SPEC) is None
    assert not s.not_enforced("b") and s.check("b", SPEC) is not None  # b's policies are known
    s.replace("namespaces", "b", [ns_obj("b", 9, team="strict")])  # b's relist does not clear a's refusal
    assert s.not_enforced("a") and not s.not_enforced("b")
    s.replace("namespaces", "a", [ns_obj("a", 10)])  # a listed at last
    assert not s.not_enforced("a") and s.refusals == {}
    s.refused("bindings", 403)  # a cluster-wide kind: nothing is enforced
    assert s.not_enforced("a") and s.not_enforced("b")


def test_the_concurrency_limit_of_a_namespace_is_the_lowest_maxactiveruns_of_its_policies(store):
    """decide/queue.py: the limit comes from the policies the namespace's bindings select; a change of
    it names the namespaces whose (queued) runs must be looked at again."""
    s, changes = store
    assert s.limits("a") is None and s.limits("b") is None
    limited = policy("strict", 8, ["*"])
    limited["spec"]["maxActiveRuns"] = 2
    limited["spec"]["maxActiveRunsPerAgent"] = {"clerk": 1}
    limited["spec"]["maxActiveRunsPerModel"] = {"gpt-4o": 3}
    s.event("policies", "MODIFIED", limited)
    got = s.limits("b")
    assert got is not None and got.namespace == (2, "strict") and s.limits("a") is None
    assert dict(got.agents) == {"clerk": (1, "strict")} and dict(got.models) == {"gpt-4o": (3, "strict")}
    assert changes and (changes[-1] is None or "b" in changes[-1])
