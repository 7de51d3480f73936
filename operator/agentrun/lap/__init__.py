"""The lap runner (``agentrun lap``: one lap of an AgentRun per process, see docs/lap-runner.md).

Entry points: ``agentrun.lap.entry`` (what ``agentrun lap`` runs, without click), ``agentrun.lap.command``
(the same as a click command, for ``agentrun lap --help`` and ``python -m agentrun.cli.main lap``) and
``agentrun.lap.process`` (the lap configured by an environment mapping: ``run_from_env``).
"""
