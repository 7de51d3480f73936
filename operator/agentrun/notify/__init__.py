"""Webhook notifications of approvals (docs/inbox.md#notifications).

* ``plan``: pure. ``announcements(run, now, settings)``: which messages a run is due ("requested"
  once its approval is pending, "deadline-near" once its deadline is within the configured time),
  from ``status.approval`` and what ``status.approval.notified`` says was already delivered;
  ``body(notice, format)``: the JSON of the generic, Slack or Teams message; ``notified_patch``.
* ``sender``: the ``Notifier``, a background thread of its own (never in the reconcile path):
  it looks at the runs every few seconds (LISTed through the API standalone; taken from the watch
  cache, and woken by it, inside the operator), delivers what ``plan`` says with retries and backoff, and
  records each delivery in ``status.approval.notified`` so a restart does not announce again.
"""
