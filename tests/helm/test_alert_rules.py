"""The alerts: one source (files/alerts.yaml), the plain rules file is its default rendering,
and promtool checks the rules and runs the unit tests of alerts_test.yaml (every alert firing
and not firing)."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import yaml
from helm_support import ROOT

RULES = ROOT / "helm" / "prometheus" / "agentrun-alerts.yaml"
TESTS = pathlib.Path(__file__).with_name("alerts_test.yaml")
sys.path.insert(0, str(ROOT / "tools"))
import render_alerts  # noqa: E402


def alerts_in(path):
    return {r["alert"] for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]}


def test_plain_rules_file_is_the_default_rendering_of_the_chart(helm):
    assert RULES.read_text() == render_alerts.render(helm), "run `make helm-alerts`"


def test_promtool_check_rules(promtool):
    proc = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 9 rules found" in proc.stdout + proc.stderr


def test_promtool_unit_tests(promtool):
    proc = subprocess.run([promtool, "test", "rules", str(TESTS)], capture_output=True, text=True, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_not_firing():
    spec = yaml.safe_load(TESTS.read_text())
    firing, silent = set(), set()
    for group in spec["tests"]:
        for t in group.get("alert_rule_test", []):
            (firing if t["exp_alerts"] else silent).add(t["alertname"])
    every = alerts_in(RULES)
    assert every == firing, every ^ firing
    assert every == silent, every ^ silent


def test_promtool_catches_a_wrong_expectation(promtool, tmp_path):
    """The unit tests can fail: flip one expectation and promtool must report it."""
    spec = yaml.safe_load(TESTS.read_text())
    spec["rule_files"] = [str(RULES)]
    for group in spec["tests"]:
        for t in group.get("alert_rule_test", []):
            if t["alertname"] == "AgentRunRetryStorm" and t["exp_alerts"]:
                t["exp_alerts"] = []
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec))
    proc = subprocess.run([promtool, "test", "rules", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0 and "AgentRunRetryStorm" in proc.stdout + proc.stderr


def test_thresholds_come_from_values(helm):
    text = render_alerts.render(helm, ["--set", "prometheusRule.thresholds.retryStormThreshold=7",
                                       "--set", "prometheusRule.job=my-job"])
    assert "> 7\n" in text or "> 7 " in text or text.count("> 7") == 1
    assert 'up{job="my-job"}' in text
    assert "[[" not in text
