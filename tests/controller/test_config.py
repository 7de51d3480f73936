"""The operator's configuration from its environment (controller/config.py): a bad value is refused
naming the variable."""

from __future__ import annotations

import pytest

from agentrun.controller.config import OperatorConfig


@pytest.mark.parametrize("var", ["AGENTRUN_LIVENESS_PORT", "AGENTRUN_METRICS_PORT"])
@pytest.mark.parametrize("value", ["65536", "-1", "100000"])
def test_a_port_out_of_range_is_refused_naming_the_variable(var: str, value: str) -> None:
    with pytest.raises(ValueError) as e:
        OperatorConfig.from_env({var: value})
    assert str(e.value) == f"{var}: expected a TCP port, 1 to 65535 (0: off), got {int(value)}"


def test_a_port_in_range_or_off_is_taken() -> None:
    cfg = OperatorConfig.from_env({"AGENTRUN_LIVENESS_PORT": "65535", "AGENTRUN_METRICS_PORT": "0"})
    assert (cfg.liveness_port, cfg.metrics_port) == (65535, 0)
    cfg = OperatorConfig.from_env({"AGENTRUN_LIVENESS_PORT": "1"})
    assert cfg.liveness_port == 1


def test_the_command_refuses_a_port_out_of_range_naming_the_variable_or_the_flag() -> None:
    from click.testing import CliRunner

    from agentrun.controller import command

    r = CliRunner().invoke(command.operator_command, [], env={"AGENTRUN_LIVENESS_PORT": "70000"})
    assert r.exit_code == 2 and "AGENTRUN_LIVENESS_PORT: expected a TCP port, 1 to 65535 (0: off), got 70000" \
        in r.output, r.output
    r = CliRunner().invoke(command.operator_command, ["--liveness-port", "70000"])
    assert r.exit_code == 2 and "--liveness-port" in r.output and "0<=x<=65535" in r.output, r.output
