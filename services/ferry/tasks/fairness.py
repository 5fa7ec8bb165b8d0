"""Fair share between clients: what admission needs to put a task in its fair place. Pure code.

While a model's backlog of one priority in a partition is contended (``after`` unfinished tasks
or more there), new tasks wait in the partition's fair queue, ordered by start-time fair
queueing (Goyal, Vin and Cheng, SIGCOMM 1996): a flow (one client's tasks of one model) of
weight ``w`` gives each task the start tag ``S = max(V, F)``, where ``V`` is the start tag of
the task sent last and ``F`` the flow's previous finish tag, and the finish tag ``F = S +
cost / w``; tasks leave in the order of their start tags. Its bound: over any interval in which
two flows ``i`` and ``j`` both wait, the work sent for them, each divided by its weight, differs
by at most ``cost_max_i / w_i + cost_max_j / w_j``, whatever the server's speed. It is
work-conserving: a flow alone is sent everything it has, and a flow that stops waiting leaves
its share to the others at once. The Lua side is ``tasks/lua/admit.lua`` (the tags) and
``queue/lua/fair_read.lua`` (the order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ferry.v1.task_pb2 import Task


def rows_of(task: Task) -> int:
    """What a task costs its flow: the rows it sends to Triton (a tensor request's first
    dimension, a payload task one)."""
    if task.inputs and task.inputs[0].shape:
        return max(1, int(task.inputs[0].shape[0]))
    return 1


@dataclass(frozen=True)
class Fairness:
    """Fair share's settings as admission applies them: from how many unfinished tasks of a
    model and priority in a partition tasks wait in fair order (0: never, first come first
    served), and each client's weight (1 unless named)."""

    after: int = 0
    weights: Mapping[str, float] = field(default_factory=dict)

    def weight(self, client_id: str) -> float:
        return self.weights.get(client_id, 1.0)


OFF = Fairness()
