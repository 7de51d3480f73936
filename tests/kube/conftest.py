"""The informer's tests feed the run cache: they build its objects with tests/controller/cache_objects.py,
so that folder is on the import path here as it is for the controller's tests."""

from __future__ import annotations

import sys
from pathlib import Path

CONTROLLER_TESTS = str(Path(__file__).resolve().parents[1] / "controller")
if CONTROLLER_TESTS not in sys.path:
    sys.path.insert(0, CONTROLLER_TESTS)
