"""Outcome notifications (issue 31): a run's terminal phase announced once per outcome, chosen per
run (spec.notify.outcomes) or by the operator's default (AGENTRUN_NOTIFY_OUTCOMES), recorded in
status.lifecycle.notified; a retried run's next outcome is a new message."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from test_sender import NO_PORTS, ports, receiver  # noqa: F401  (receiver: the fixture)

from agentrun.api.status import AgentRunStatus
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
