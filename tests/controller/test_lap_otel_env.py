"""The operator passes its OpenTelemetry variables (the chart's ``tracing`` values) to every lap Job:
only the names of agentrun.api.contract.LAP_OTEL_ENV, never the exporter's headers (a token)."""
from __future__ import annotations

from controller_world import UID, make_spec

from agentrun.controller.config import OperatorConfig
from agentrun.controller.decide.jobs import RunIdentity, build_job

BASE = {"AGENTRUN_CHECKPOINT_URI": "s3://bucket/prefix"}


def _env(cfg: OperatorConfig) -> dict[str, str]:
    job = build_job(RunIdentity("ns", "run", UID), make_spec(), 1, 1, "v1", cfg)
    return {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_no_tracing_variables_without_tracing() -> None:
    cfg = OperatorConfig.from_env(BASE)
    assert cfg.lap_otel_env == () and not [n for n in _env(cfg) if n.startswith("OTEL_")]


def test_the_operators_tracing_variables_reach_the_lap_job_and_its_exporter_headers_do_not() -> None:
    cfg = OperatorConfig.from_env({**BASE, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
                                   "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false",
                                   "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret",
                                   "OTEL_SERVICE_NAME": "agentrun-operator", "OTEL_TRACES_SAMPLER": ""})
    otel = {n: v for n, v in _env(cfg).items() if n.startswith("OTEL_")}
    assert otel == {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
                    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false"}
