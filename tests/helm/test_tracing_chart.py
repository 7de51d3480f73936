"""The chart's ``tracing`` values (docs/observability.md#traces): off by default; on, the operator gets
the standard OTEL_* variables it passes to lap Jobs (agentrun.api.contract.LAP_OTEL_ENV)."""
from __future__ import annotations

from helm_support import template

from agentrun.api.contract import LAP_OTEL_ENV


def _env(docs):
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_tracing_is_off_by_default(helm):
    _, docs = template(helm)
    assert not [n for n in _env(docs) if n.startswith("OTEL_")]


def test_tracing_values_become_the_standard_variables_the_operator_passes_on(helm):
    _, docs = template(helm, "--set", "tracing.otlpEndpoint=http://otel-collector.observability:4318",
                       "--set", "tracing.captureMessageContent=true", "--set", "tracing.sampler=traceidratio",
                       "--set-string", "tracing.samplerArg=0.25")
    otel = {n: v for n, v in _env(docs).items() if n.startswith("OTEL_")}
    assert otel == {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4318",
                    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
                    "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    assert set(otel) <= set(LAP_OTEL_ENV), "the operator passes on only the names of LAP_OTEL_ENV"
    _, docs = template(helm, "--set", "tracing.otlpEndpoint=http://c:4318")
    assert _env(docs)["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] == "false"


def test_the_schema_refuses_a_bad_endpoint_or_sampler(helm):
    for args, field in ((["--set", "tracing.otlpEndpoint=collector:4318"], "/tracing/otlpEndpoint"),
                        (["--set", "tracing.sampler=sometimes"], "/tracing/sampler"),
                        (["--set", "tracing.captureMessageContents=true"], "captureMessageContents")):
        proc, _ = template(helm, *args, check=False)
        assert proc.returncode != 0 and field in proc.stderr, proc.stderr
