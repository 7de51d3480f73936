"""``agentrun inbox``: the approval inbox, a small web application for approvers (docs/inbox.md).

One module one job:

* ``identity``: who the person is (TokenReview or a trusted auth-proxy header), signed session
  cookies and CSRF tokens (pure, apart from the key);
* ``kube``: the API server client that acts AS the person (``Impersonate-User``/``-Group``), so
  RBAC and the approval admission policies decide exactly as for ``kubectl``;
* ``view``: the pure part: rows of pending approvals and recent decisions from AgentRun dicts,
  and the HTML (every user value escaped and bounded);
* ``laps``: the run's recent laps and the full pending arguments from the checkpoint store;
* ``server``: the HTTP server (standard library), server-sent events driven by a watch;
* ``cli``: the ``agentrun inbox`` command.
"""
