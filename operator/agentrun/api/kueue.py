"""The Kueue contract: how a lap Job asks Kueue (``sigs.k8s.io/kueue``) to admit it, and how the
operator finds the Workload Kueue made of it.

Imported by the Job manifest (``controller/decide/jobs.py``), the observation of a Job
(``controller/decide/observe.py``), the shell's Workload read (``controller/kueueview.py``), the
chart's RBAC test and the e2e tests. Nothing here does I/O. docs/scheduling.md#kueue.

A run with ``spec.queueName`` (or in a namespace whose AgentRunPolicy sets ``defaultQueueName``)
gets every lap Job created **suspended**, labelled :data:`QUEUE_NAME_LABEL`. Kueue's Job
integration makes a Workload of it (labelled :data:`JOB_UID_LABEL` with the Job's uid), admits it
within its ClusterQueue's quota and unsuspends the Job; the Job controller then starts its pod.
While the Job is suspended the run is ``Queued`` (reason :data:`~agentrun.api.reasons.Reason`
``KueueQueued``) and ``status.kueue`` names the Job, LocalQueue and Workload.
"""

from __future__ import annotations

from typing import Final

QUEUE_NAME_LABEL: Final = "kueue.x-k8s.io/queue-name"
"""The label of a Job that names the LocalQueue (in the Job's namespace) Kueue admits it through."""
JOB_UID_LABEL: Final = "kueue.x-k8s.io/job-uid"
"""The label Kueue puts on the Workload it made of a Job: the Job's uid (how the operator finds it)."""
GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
WORKLOADS: Final = "workloads"
"""The Workload resource (``kueue.x-k8s.io/v1beta2``, its storage version in Kueue 0.17): the operator lists them by :data:`JOB_UID_LABEL`."""
ADMITTED_CONDITION: Final = "Admitted"
QUOTA_RESERVED_CONDITION: Final = "QuotaReserved"


def workloads_path(namespace: str) -> str:
    """The API path of the Workloads of ``namespace``."""
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{WORKLOADS}"
