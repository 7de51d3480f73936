"""``python -m agentrun.notify``: the notifier on its own (tests, or beside an operator that does
not start it), configured like the operator (``sender.from_env``), its runs listed and watched
(``sender.WatchedRuns``); in-cluster or kubeconfig. It reads no AgentRunPolicies: a run's outcomes
are its spec.notify.outcomes, else AGENTRUN_NOTIFY_OUTCOMES (the operator's notifier also applies
the policies' notifications.outcomes)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading


def main() -> int:
    from agentrun.kube.client import load_api_client
    from agentrun.notify.sender import WatchedRuns, from_env, namespaces_from_env

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    source = WatchedRuns(load_api_client(), namespaces_from_env(dict(os.environ)))
    notifier = from_env(runs=source.runs, patch_status=source.patch_status)
    if notifier is None:
        print("AGENTRUN_NOTIFY_WEBHOOK_URL is not set: nothing to do", file=sys.stderr)
        return 2
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    source.start()
    notifier.start()
    done.wait()
    notifier.stop()
    source.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
