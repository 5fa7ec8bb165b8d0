"""Fair share's settings: weights, a task's cost."""

from __future__ import annotations

import pytest

from ferry.errors import ConfigError
from ferry.settings import GatewaySettings
from ferry.settings.fairness import parse_weights
from ferry.tasks.fairness import Fairness, rows_of
from ferry.v1.task_pb2 import Task, Tensor


def test_weights_are_parsed_and_default_to_one() -> None:
    weights = parse_weights(" batch-jobs=0.2, partner=4 ")
    assert weights == {"batch-jobs": 0.2, "partner": 4.0}
    fairness = Fairness(8, weights)
    assert fairness.weight("partner") == 4.0 and fairness.weight("anyone") == 1.0


@pytest.mark.parametrize("spec", ["partner", "partner=", "=2", "partner=0", "partner=-1",
                                  "partner=nan", "partner=inf", "partner=x"])
def test_a_weight_that_is_not_positive_is_refused(spec: str) -> None:
    with pytest.raises(ConfigError, match="client_weights"):
        parse_weights(spec)


def test_the_gateway_settings_carry_the_weights() -> None:
    settings = GatewaySettings(client_weights="partner=4")
    assert settings.client_weight_map == {"partner": 4.0}
    assert settings.fair_share_after == 4
    with pytest.raises(ConfigError, match="fair_share_after"):
        GatewaySettings(fair_share_after=-1)


def test_a_task_costs_its_rows() -> None:
    assert rows_of(Task(payload=b"x")) == 1
    assert rows_of(Task(inputs=[Tensor(name="x", shape=[4, 16])])) == 4
    assert rows_of(Task(inputs=[Tensor(name="x", shape=[])])) == 1
    assert rows_of(Task(inputs=[Tensor(name="x", shape=[0, 3])])) == 1
