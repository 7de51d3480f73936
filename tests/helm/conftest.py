"""Fixtures of the chart tests: a real helm (tools/install-helm.sh) and promtool."""
from helm_support import helm, promtool  # noqa: F401
