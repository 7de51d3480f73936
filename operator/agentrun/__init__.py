"""agentrun: durable long-running AI agents on Kubernetes.

Layout (one folder, one concern):

- ``agentrun.api``        AgentRun spec/status models (pydantic) and the generated CRD schema.
- ``agentrun.checkpoint`` versioned checkpoint schema, migrations, and the S3 checkpoint store.
- ``agentrun.lap``        the lap runner: one model call plus its tool calls, journaled and keyed.
- ``agentrun.controller`` the operator: a pure reconcile decision plus a thin I/O shell, in a Kopf process.
- ``agentrun.metrics``    Prometheus metrics of the operator.
- ``agentrun.cli``        the ``agentrun`` command (``agentrun lap``, ``agentrun operator``, ...).
"""

__version__ = "0.1.0"
