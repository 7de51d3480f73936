"""``python -m agentrun.notify``: the notifier on its own (tests, or beside an operator that does
not start it), configured like the operator (``sender.from_env``); kubeconfig or in-cluster."""

from __future__ import annotations

import logging
import signal
import sys
import threading


def main() -> int:
    from kubernetes import client, config

    from agentrun.notify.sender import from_env

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config.load_kube_config()
    except Exception:
        config.load_incluster_config()
    notifier = from_env(client.CustomObjectsApi())
    if notifier is None:
        print("AGENTRUN_NOTIFY_WEBHOOK_URL is not set: nothing to do", file=sys.stderr)
        return 2
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    notifier.start()
    done.wait()
    notifier.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
