"""Webhook notifications of approvals and run outcomes (docs/inbox.md#notifications).

* ``plan``: pure. ``announcements(run, now, settings, outcomes)``: which messages a run is due
  ("requested" once its approval is pending, "deadline-near" once its deadline is within the
  configured time, "outcome" once it ends in a chosen terminal phase), from ``status.approval`` /
  ``status.phase`` and what ``status.approval.notified`` / ``status.lifecycle.notified`` say was
  already delivered; which outcomes are chosen: the run's spec.notify, else its namespace's
  AgentRunPolicies (``namespace_outcomes``), else the operator's default; ``body(notice, format)``:
  the JSON of the generic, Slack or Teams message; ``notified_patch``.
* ``sender``: the ``Notifier``, a background thread of its own (never in the reconcile path):
  it looks at the runs every few seconds (listed and watched standalone; taken from the watch
  cache, and woken by it, inside the operator), delivers what ``plan`` says with retries and backoff, and
  records each delivery in the run's status so a restart does not announce again.
"""
