"""Outcome notifications (issue 31): a run's terminal phase announced once per outcome, chosen per
run (spec.notify.outcomes), else by its namespace's AgentRunPolicies (notifications.outcomes: the
union of those that set it), else by the operator's default (AGENTRUN_NOTIFY_OUTCOMES), recorded in
status.lifecycle.notified; a retried run's next outcome is a new message."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sender import NO_PORTS, ports, receiver  # noqa: F401  (receiver: the fixture)

from agentrun.api.lifecycle import OUTCOMES
from agentrun.api.status import AgentRunStatus
from agentrun.api.tenancy import AgentRunPolicySpec, PolicyUnreadable
from agentrun.notify import plan
from agentrun.notify.sender import Notifier, from_env

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


class Api:
    def __init__(self, run: dict) -> None:
        self.run, self.patches = run, []

    def runs(self):  # the notifier's source port
        return [json.loads(json.dumps(self.run))]

    def patch_status(self, ns, name, patch):  # its status writer port
        self.patches.append(patch)
        self.run["status"].setdefault("lifecycle", {}).update(patch["status"]["lifecycle"])


def finished(phase="Failed", outcomes=("Failed", "Succeeded"), retries=0):
    spec = {"notify": {"outcomes": list(outcomes)}} if outcomes is not None else {}
    return {"metadata": {"namespace": "ns", "name": "r", "uid": "u"}, "spec": spec,
            "status": {"phase": phase, "message": "lap 2 attempt 3 failed <!channel>", "lap": 2,
                       "cost": {"usd": "0.42"}, "lifecycle": {"retries": retries}}}


def test_an_outcome_is_announced_once_and_again_after_a_retry(receiver):  # noqa: F811
    url, _, got = receiver
    api = Api(finished())
    n = Notifier(**ports(api), url=url, clock=lambda: 0.0)
    for _ in range(3):
        n.scan(NOW)
    assert [(b["kind"], b["phase"], b["retries"]) for b in got] == [("outcome", "Failed", 0)]
    AgentRunStatus.model_validate(api.run["status"])  # the record is a valid status.lifecycle
    assert api.run["status"]["lifecycle"]["notified"]["phase"] == "Failed"
    Notifier(**ports(api), url=url, clock=lambda: 0.0).scan(NOW)  # a restarted notifier reads the record
    assert len(got) == 1
    api.run["status"]["lifecycle"]["retries"] = 1  # retried, failed again
    n.scan(NOW)
    assert [(b["phase"], b["retries"]) for b in got] == [("Failed", 0), ("Failed", 1)]
    assert got[0]["idempotencyKey"] != got[1]["idempotencyKey"]
    n.stop()


@pytest.mark.parametrize("run, defaults, due", [
    (finished("Succeeded", outcomes=("Failed",)), (), False),
    (finished("Cancelled", outcomes=None), ("Cancelled",), True),
    (finished("Cancelled", outcomes=()), ("Cancelled",), False),  # the run chose none
    (finished("DeadlineExceeded", outcomes=("DeadlineExceeded",)), (), True),
    ({"metadata": {}, "spec": {"notify": {"outcomes": ["Failed"]}}, "status": {"phase": "Running"}}, (), False),
])
def test_which_outcomes_are_due(run, defaults, due):
    assert (plan.outcome_due(run, defaults) is not None) == due


def test_outcome_messages_are_text_in_every_format():
    n = plan.outcome_due(finished(), ())
    assert n is not None
    assert "<!channel>" not in plan.body(n, "slack")["text"] and "&lt;!channel&gt;" in plan.body(n, "slack")["text"]
    card = plan.body(n, "teams")["attachments"][0]["content"]
    assert card["body"][0]["text"].startswith("Run failed")
    assert plan.body(n, "generic")["costUSD"] == "0.42"


def test_the_default_outcomes_come_from_the_environment():
    n = from_env({"AGENTRUN_NOTIFY_WEBHOOK_URL": "http://x/", "AGENTRUN_NOTIFY_OUTCOMES": "Failed, Cancelled"}, **NO_PORTS)
    assert n is not None and n.settings.outcomes == ("Failed", "Cancelled")
    n._http.close()
    with pytest.raises(ValueError, match="AGENTRUN_NOTIFY_OUTCOMES: 'Done' is not an outcome"):
        from_env({"AGENTRUN_NOTIFY_WEBHOOK_URL": "http://x/", "AGENTRUN_NOTIFY_OUTCOMES": "Done"}, **NO_PORTS)


# ------------------------------------------------------------------ chosen by the namespace's AgentRunPolicies

def spec(outcomes=None) -> AgentRunPolicySpec:
    return AgentRunPolicySpec.model_validate({} if outcomes is None else {"notifications": {"outcomes": list(outcomes)}})


_POLICY = st.one_of(
    st.none(),  # named by a binding, missing
    st.just(PolicyUnreadable("notifications.outcomes.0: not an outcome")),
    st.none().map(lambda _: spec()),  # readable, field unset
    st.lists(st.sampled_from(OUTCOMES), max_size=5, unique=True).map(spec),
)


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=4), _POLICY, max_size=6))
def test_the_policies_choice_is_the_union_of_those_that_set_it(policies):
    got = plan.policy_outcomes(policies)
    setters = [p.notifications.outcomes for p in policies.values()
               if isinstance(p, AgentRunPolicySpec) and p.notifications.outcomes is not None]
    if not setters:
        assert got is None  # no say: the operator's default applies
        assert plan.namespace_outcomes(policies, ("Cancelled",)) == ("Cancelled",)
        return
    assert got is not None and set(got) == set().union(*map(set, setters))
    assert list(got) == [o for o in OUTCOMES if o in got]  # canonical order, no duplicates
    assert plan.policy_outcomes(dict(reversed(list(policies.items())))) == got  # the order of policies does not matter
    assert plan.namespace_outcomes(policies, ("Cancelled",)) == got  # replaces the default, even when empty
    # adding a policy never takes an outcome away
    more = plan.policy_outcomes({**policies, "zz-extra": spec(("DeadlineExceeded",))})
    assert more is not None and set(got) <= set(more)


def test_policies_not_known_leave_the_default():
    assert plan.policy_outcomes(None) is None and plan.namespace_outcomes(None, ("Failed",)) == ("Failed",)
    assert plan.namespace_outcomes({"default": spec()}, ("Failed",)) == ("Failed",)
    assert plan.namespace_outcomes({"default": spec(()), "team": spec()}, ("Failed",)) == ()  # an explicit opt-out


@pytest.mark.parametrize("run_outcomes, policies, chart, announced", [
    (None, {"team": spec(("Failed",))}, (), True),              # the policy chooses for a run without spec.notify
    (None, {"default": spec()}, (), False),                     # no policy sets it: the chart's (empty)
    (None, {"default": spec()}, ("Failed",), True),             # ... the chart's
    (None, {"team": spec(())}, ("Failed",), False),             # the policy's [] replaces the chart's
    ((), {"team": spec(("Failed",))}, ("Failed",), False),      # the run's spec.notify replaces both
    (("Failed",), {"team": spec(())}, (), True),
    (None, {"a": spec(("Succeeded",)), "b": spec(("Failed",))}, (), True),  # the union
])
def test_precedence_run_then_policies_then_chart(run_outcomes, policies, chart, announced):
    run = finished("Failed", outcomes=run_outcomes)
    defaults = plan.namespace_outcomes(policies, chart)
    assert (plan.outcome_due(run, defaults) is not None) == announced
    notices = plan.announcements(run, NOW, plan.Settings(outcomes=chart), defaults)
    assert [n.kind for n in notices] == (["outcome"] if announced else [])


def test_the_notifier_asks_each_namespace_once_per_scan(receiver):  # noqa: F811
    """Its ``outcomes`` port (the operator: the namespace's policies) decides for runs without
    spec.notify; the chart's default (settings.outcomes) is used only without the port."""
    url, _, got = receiver
    runs = [finished("Failed", outcomes=None), finished("Failed", outcomes=None)]
    runs[1]["metadata"] = {"namespace": "other", "name": "r2", "uid": "u2"}
    runs.append({**finished("Failed", outcomes=None), "metadata": {"namespace": "ns", "name": "r3", "uid": "u3"}})
    asked: list[str] = []

    def outcomes(ns: str) -> tuple[str, ...]:
        asked.append(ns)
        return ("Failed",) if ns == "ns" else ()

    n = Notifier(runs=lambda: runs, patch_status=lambda *a: None, url=url, clock=lambda: 0.0,
                 settings=plan.Settings(outcomes=("Failed",)), outcomes=outcomes)
    n.scan(NOW)
    assert sorted(asked) == ["ns", "other"]
    assert sorted(b["name"] for b in got) == ["r", "r3"]  # "other"'s policy chose none, over the chart's Failed
    n.stop()
