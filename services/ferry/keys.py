"""Every Redis key, stream, group and channel name Ferry uses, and their lifetimes, in one place."""

from __future__ import annotations

import re
import secrets
import zlib

PREFIX = "ferry"
CONSUMER_GROUP = "ferry-batchers"
DEAD_LETTER_STREAM = f"{PREFIX}:dead"
RESULT_CHANNEL = f"{PREFIX}:results:done"
TASK_FIELD = "task"  # the stream entry field that holds the serialized envelope

TASK_ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")


def partition_stream(partition: int) -> str:
    """The stream of one partition: ``ferry:tasks:{0..N-1}``."""
    return f"{PREFIX}:tasks:{partition}"


def result_key(task_id: str) -> str:
    """The hash that holds a task's status and result."""
    return f"{PREFIX}:result:{task_id}"


def new_task_id() -> str:
    """128 random bits as 32 hex digits: unguessable, and safe in URLs and keys."""
    return secrets.token_hex(16)


def is_task_id(value: str) -> bool:
    return TASK_ID_PATTERN.fullmatch(value) is not None


def partition_of(task_id: str, partitions: int) -> int:
    """Spread tasks evenly and reproducibly over the partitions."""
    return zlib.crc32(task_id.encode()) % partitions
