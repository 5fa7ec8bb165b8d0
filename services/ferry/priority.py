"""Task priorities: high, normal, low and batch, and what each may take of a model's backlog.

Each priority has its own stream per partition, so higher priorities are read (boarded) first,
and its own boarding lanes, so they leave first: a high-priority task rides the next batch.
Normal work never starves low: a task a batcher has read boards ahead of every priority but high
once it has waited ``priority_aging_s``.
Admission gives each priority a share of the backlog limit (a new task is refused when the
model's backlog has reached its priority's share), so bulk low-priority work cannot fill the
room interactive traffic needs.
``batch`` is below them all, for the items of bulk jobs (``ferry.jobs``): it fills the room
interactive traffic leaves. It never ages ahead of another priority, and its tasks do not count
against the interactive priorities' backlog limits (only against its own share).
"""

from __future__ import annotations

from enum import IntEnum

from ferry.errors import BadRequestError


class Priority(IntEnum):
    """Higher values go first; the value is what the queue envelope carries."""

    BATCH = -2
    LOW = -1
    NORMAL = 0
    HIGH = 1

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def backlog_share(self) -> float:
        """The fraction of a model's backlog limit this priority may fill (counting every
        interactive priority's tasks): low work stops at half, normal leaves a tenth for high;
        batch work counts every priority's and stops at a quarter."""
        return _SHARES[self]

    @classmethod
    def parse(cls, value: str | None, where: str) -> Priority:
        """``high``, ``normal``, ``low`` or ``batch`` (None: normal), or a 400 naming
        ``where``."""
        if value is None:
            return cls.NORMAL
        for priority in cls:
            if value.lower() == priority.label:
                return priority
        raise BadRequestError("invalid_priority", f"{where} must be 'high', 'normal', 'low' "
                              f"or 'batch', not {value!r}")

    @classmethod
    def of(cls, value: int) -> Priority:
        """From an envelope's number; out-of-range numbers clamp to the nearest priority."""
        return cls(max(cls.BATCH, min(cls.HIGH, value)))

    @property
    def interactive(self) -> bool:
        """Whether a client waits for it (every priority but batch)."""
        return self is not Priority.BATCH


_SHARES = {Priority.HIGH: 1.0, Priority.NORMAL: 0.9, Priority.LOW: 0.5, Priority.BATCH: 0.25}
BY_URGENCY = (Priority.HIGH, Priority.NORMAL, Priority.LOW, Priority.BATCH)
