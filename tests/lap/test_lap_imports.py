"""What the lap process imports: never Kopf or the Kubernetes client, and the optional heavy
dependencies (YAML, jsonschema, httpx, the OpenAI provider) only when the lap needs them.
Each check runs in a fresh interpreter, since this test process has imported everything."""

from __future__ import annotations

import os
import subprocess
import sys


def _modules_after(code: str, *names: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(','.join(n for n in {names!r} if n in sys.modules))"
    p = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert p.returncode == 0, p.stderr
    return [n for n in p.stdout.strip().split(",") if n]


def test_the_lap_entrypoint_imports_neither_kopf_nor_kubernetes_nor_click() -> None:
    assert _modules_after("import agentrun.lap.process", "kopf", "kubernetes", "click") == []


def test_optional_dependencies_are_not_imported_at_lap_start_up() -> None:
    loaded = _modules_after(
        "import agentrun.lap.process", "yaml", "jsonschema", "httpx", "agentrun.lap.models.openai",
        "mcp", "httpx2", "anyio", "agentrun.lap.tools.mcp",
    )
    assert loaded == []


def test_a_scripted_lap_without_tools_or_script_file_needs_no_yaml_jsonschema_or_httpx() -> None:
    code = """
from agentrun.api.spec import AgentRunSpec
from agentrun.lap.models import make_model
from agentrun.lap.tools.http import HTTPToolRunner
from agentrun.lap.tools.validate import check_tool_schemas
spec = AgentRunSpec.model_validate({"task": "t", "agent": {"version": "v1", "model": {"provider": "scripted", "script": [{"content": "done"}]}}})
check_tool_schemas(spec.agent.tools)
HTTPToolRunner.from_env(spec.agent.tools, {})
make_model(spec, {})
"""
    assert _modules_after(code, "yaml", "jsonschema", "httpx", "httpcore", "mcp", "httpx2") == []


def test_the_first_tool_schema_check_loads_jsonschema_and_still_refuses_a_bad_schema() -> None:
    code = """
from agentrun.api.spec import ToolSpec
from agentrun.lap.errors import ConfigError
from agentrun.lap.tools.validate import check_tool_schemas
bad = ToolSpec.model_validate({"name": "t", "parameters": {"type": 7}, "http": {"url": "http://127.0.0.1:1/x"}})
try:
    check_tool_schemas([bad])
except ConfigError as e:
    assert "spec.agent.tools[t].parameters is not a valid JSON Schema" in str(e), e
else:
    raise AssertionError("bad schema accepted")
"""
    assert _modules_after(code, "jsonschema") == ["jsonschema"]


def test_the_lap_entrypoint_imports_neither_boto3_nor_botocore() -> None:
    """botocore is imported when the store's client is made, by the lap's first step; boto3 and its
    S3 transfer layer (s3transfer) never (the store makes botocore's client itself)."""
    assert _modules_after("import agentrun.lap.process", "boto3", "botocore", "s3transfer") == []


def test_making_the_store_client_imports_botocore_but_not_boto3() -> None:
    code = """
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
store = CheckpointStore(StoreConfig(uri="s3://b-1/p", endpoint_url="http://127.0.0.1:9", region="us-east-1"))
assert type(store.client).__name__ == "S3", type(store.client)
"""
    assert _modules_after(code, "boto3", "s3transfer", "botocore") == ["botocore"]


def _lap_probe(argv: list[str], env: dict[str, str]) -> list[str]:
    """Runs the ``agentrun`` console script's function with ``argv``, in a fresh interpreter; the
    exit code, then whether click was imported, then PYDANTIC_DISABLE_PLUGINS."""
    probe = f"""
import os, sys
sys.argv = {["agentrun", *argv]!r}
from agentrun.cli.entry import main
try:
    main()
except SystemExit as e:
    print(e.code)
print("click" in sys.modules)
print(repr(os.environ.get("PYDANTIC_DISABLE_PLUGINS")))
"""
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-3:]


def _env_without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names and not k.startswith("AGENTRUN_")}


def test_the_console_script_is_the_entry_that_dispatches_the_lap_without_click() -> None:
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["agentrun"] == "agentrun.cli.entry:main"
    assert _modules_after("import agentrun.cli.entry, agentrun.lap.entry", "click", "pydantic", "botocore") == []


def test_agentrun_lap_runs_the_lap_without_importing_click() -> None:
    """``agentrun lap`` (the lap Job's command) with no configuration: the lap's own refusal (exit 2,
    permanent), with click never imported; ``agentrun lap --help`` is click's."""
    code, click_loaded, _ = _lap_probe(["lap"], _env_without())
    assert (code, click_loaded) == ("2", "False")
    code, click_loaded, _ = _lap_probe(["lap", "--help"], _env_without())
    assert (code, click_loaded) == ("0", "True")


def test_the_lap_entry_turns_pydantic_plugin_discovery_off_unless_the_environment_sets_it() -> None:
    """Set by the lap's process entry (both ``agentrun lap`` and the click command ``python -m
    agentrun.cli.main lap``), before the lap builds a pydantic model; importing the package does
    not touch the importer's environment."""
    env = _env_without("PYDANTIC_DISABLE_PLUGINS")
    for given, expected in ((None, "'__all__'"), ("", "''"), ("logfire", "'logfire'")):
        run_env = env if given is None else {**env, "PYDANTIC_DISABLE_PLUGINS": given}
        assert _lap_probe(["lap"], run_env)[::2] == ["2", expected], given
    click_path = """
import os, sys
from agentrun.cli.main import main
try:
    main(["lap"])
except SystemExit as e:
    print(e.code, repr(os.environ.get("PYDANTIC_DISABLE_PLUGINS")))
"""
    p = subprocess.run([sys.executable, "-c", click_path], capture_output=True, text=True, timeout=60, check=False,
                       env=env)
    assert p.stdout.split() == ["2", "'__all__'"], p.stderr
    probe = "import os, agentrun.lap, agentrun.lap.process; print(repr(os.environ.get('PYDANTIC_DISABLE_PLUGINS')))"
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "None"


def test_the_lap_start_parses_no_model_source() -> None:
    """The API models take their descriptions from ``Field(description=...)``: building them reads
    no module source (pydantic's ``use_attribute_docstrings`` reads and tokenizes each model's
    module, which leaves it in ``linecache``)."""
    probe = """
import linecache
from agentrun.api.spec import AgentRunSpec
from agentrun.lap.config import parse_env
import agentrun.lap.process
AgentRunSpec.model_validate({"task": "t", "agent": {"version": "v1", "model": {"provider": "openai", "name": "m"}}})
print(",".join(f for f in linecache.cache if "agentrun" in f))
"""
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == ""


def test_the_lap_start_does_not_build_the_agent_models() -> None:
    """``api.agent`` (the Agent resource's models) is imported by the store only to read a run's
    pinned Agent copy, which the lap never does at start."""
    assert _modules_after("import agentrun.lap.process", "agentrun.api.agent") == []
    code = """
from agentrun.checkpoint.store import CheckpointStore
assert CheckpointStore.get_agent.__name__ == "get_agent"
"""
    assert _modules_after(code, "agentrun.api.agent") == []


def test_the_lap_entry_keeps_trio_out_and_httpx_still_works() -> None:
    """After the lap entry's preparation, ``import trio`` fails as if trio were not installed, and
    httpx (whose httpcore imports trio when it can) makes a client and a request all the same; a
    process that imported trio before keeps it."""
    code = """
import http.server, threading
from agentrun.lap.entry import prepare_process
prepare_process()
try:
    import trio
except ImportError:
    pass
else:
    raise AssertionError("trio imported")
from agentrun.lap.httpx_lite import httpx
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(204); self.end_headers()
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
with httpx.Client() as c:
    assert c.get(f"http://127.0.0.1:{srv.server_address[1]}/").status_code == 204
"""
    assert _modules_after(code, "httpx", "httpcore") == ["httpx", "httpcore"]
    p = subprocess.run([sys.executable, "-c", "import sys\nsys.modules['trio'] = sys\n"
                        "from agentrun.lap.entry import prepare_process\nprepare_process()\n"
                        "assert sys.modules['trio'] is sys"], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
