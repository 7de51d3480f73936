"""The lap runner (``agentrun lap``: one lap of an AgentRun per process, see docs/lap-runner.md).

Importing this package sets ``PYDANTIC_DISABLE_PLUGINS=__all__`` unless the environment sets it
(to anything, even empty): pydantic otherwise scans the entry points of every installed
distribution for its plugins when it builds the first model, 10-25 ms of every lap pod's start,
and the lap uses no pydantic plugin.
"""

import os

os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
