"""AgentSchedules (docs/scheduling.md): AgentRuns started on a cron schedule, as CronJob starts Jobs.

The functional core (:mod:`.core`: ``plan(now, schedule, runs) -> Plan``, and :mod:`.cron`, the
times by cronsim) is pure; the shell (:mod:`.shell`) watches the AgentSchedules with
``agentrun.kube``'s informer, queues them, reads their runs from the run controller's watch cache
and does what the core plans, only on the holder of the operator's Lease (``.importlinter``)."""
