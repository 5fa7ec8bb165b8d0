"""Every Redis key, stream, group and channel name Ferry uses, and their lifetimes, in one place.

Everything about one task lives in its partition's hash slot: the names carry a ``{pN}`` hash tag,
so a Lua script can touch a task's record, its partition stream and its partition's dead letters at
once, on a single Redis or on a Redis Cluster.
"""

from __future__ import annotations

import os
import re
import secrets

from ferry.priority import BY_URGENCY, Priority

PREFIX = "ferry"
CONSUMER_GROUP = "ferry-batchers"
# Completions are announced per batch and partition on the channel of the process that made
# each task's id (its last ANNOUNCE_TAG_LENGTH hex digits): ``ferry:done:<tag>``, so that a gateway
# process reads the announcements of its own tasks only (``done_channel``).
DONE_CHANNEL_PREFIX = f"{PREFIX}:done:"
DONE_CHANNEL = f"{PREFIX}:done"  # every completion, before tags (a gateway listens for batchers
# of an earlier version during an upgrade: nothing of this version publishes there)
ANNOUNCE_TAG_LENGTH = 4
CANCEL_CHANNEL = f"{PREFIX}:cancel"  # ids of cancelled tasks a batcher may hold
TASK_FIELD = "task"  # the stream entry field that holds the serialized envelope

TASK_ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")
TASK_ID_LENGTH = 32


def slot_tag(partition: int) -> str:
    """The hash tag that puts every key of one partition in one slot."""
    return f"{{p{partition}}}"


def partition_stream(partition: int, priority: Priority = Priority.NORMAL) -> str:
    """The stream of one partition and priority: ``ferry:{p0}:tasks`` (normal),
    ``ferry:{p0}:tasks:high``, ``ferry:{p0}:tasks:low``."""
    suffix = "" if priority is Priority.NORMAL else f":{priority.label}"
    return f"{PREFIX}:{slot_tag(partition)}:tasks{suffix}"


def partition_streams(partition: int) -> list[str]:
    """Every priority's stream of a partition, most urgent first."""
    return [partition_stream(partition, priority) for priority in BY_URGENCY]


def backlog_key(partition: int) -> str:
    """Unfinished tasks of one partition, counted per model and priority (fields
    ``<model>|<priority value>``), kept by the admission and completion scripts."""
    return f"{PREFIX}:{slot_tag(partition)}:backlog"


def backlog_field(model: str, priority: Priority) -> str:
    return f"{model}|{int(priority)}"


def client_backlog_field(client_id: str) -> str:
    """A client's unfinished tasks in a partition's backlog hash: ``@<client id>`` (client ids
    have no '|', so this never names a model's field)."""
    return f"@{client_id}"


def rate_key(client_id: str) -> str:
    """A client's request rate state (GCRA's theoretical arrival time), in a slot of its own."""
    return f"{PREFIX}:rate:{{{client_id}}}"


def replica_probe_key(partition: int) -> str:
    """Written before a WAIT that must cover what is already in the partition's slot (an
    idempotent replay of a task whose admission was never confirmed): ``ferry:{p3}:probe``."""
    return f"{PREFIX}:{slot_tag(partition)}:probe"


def bell_key(partition: int, priority: Priority) -> str:
    """Set (for ``BELL_MS``) when a task of a priority other than normal rang its partition's
    doorbell: an entry in the normal stream that tells batchers to read that priority's streams."""
    return f"{PREFIX}:{slot_tag(partition)}:bell:{priority.label}"


BELL_FIELD = "bell"  # a doorbell entry's one field: the priority's value


def fair_queue(partition: int, priority: Priority) -> str:
    """Where a partition's tasks of one priority wait in fair order while its model's backlog
    there is contended (a sorted set: task id by start tag, ``ferry.rules.fairness``):
    ``ferry:{p0}:fair:normal``."""
    return f"{PREFIX}:{slot_tag(partition)}:fair:{priority.label}"


def fair_state(partition: int, priority: Priority) -> str:
    """That queue's virtual clock and flows (a hash: ``v``, the start tag last sent; ``w``, the
    waiting flows' weights; per flow ``f|<flow>`` its last finish tag, ``n|<flow>`` its tasks
    waiting, ``w|<flow>`` its weight): ``ferry:{p0}:fairstate:normal``."""
    return f"{PREFIX}:{slot_tag(partition)}:fairstate:{priority.label}"


def fair_flow(client_id: str, model: str) -> str:
    """A fair queue's flow: one client's tasks of one model (client ids have no '|')."""
    return f"{client_id}|{model}"


FAIR_FIELD = "fair"  # a fair doorbell's one field: the priority whose fair queue filled
FAIR_STATE_TTL_MS = 86_400_000  # a fair state no admission has touched for a day goes
BELL_MS = 1000  # a priority rings at most once a second per partition; readers stay awake longer

CAPACITY_KEY = f"{PREFIX}:capacity"  # batchers' measured service rates and breaker states
# Every batcher's lease: consumer name -> Redis's clock (ms) at its last heartbeat; and '~heard'
# (any batcher's last beat) and '~grace' (after a silence, until when nobody is named dead).
BATCHERS_KEY = f"{PREFIX}:batchers"
BATCHERS_TTL_MS = 86_400_000  # the hash goes when no batcher has beaten for a day


def dead_letter_stream(partition: int) -> str:
    """Tasks of one partition that failed for good, payload included: ``ferry:{p3}:dead``."""
    return f"{PREFIX}:{slot_tag(partition)}:dead"


def ledger_key(partition: int, hour: str) -> str:
    """One hour (UTC, ``YYYYMMDDHH``) of a partition's usage ledger: per client and model, the
    tasks finished, their rows and their GPU microseconds (``ferry.usage.ledger``), counted by
    the completion script as it writes each final record: ``ferry:{p3}:ledger:2026112704``."""
    return f"{PREFIX}:{slot_tag(partition)}:ledger:{hour}"


LEDGER_TTL_S = 35 * 86400  # an hour of the ledger is kept 35 days after its last count


def task_key(task_id: str, partition: int) -> str:
    """The hash that holds a task's status and its public JSON record."""
    return task_key_prefix(partition) + task_id


def task_key_prefix(partition: int) -> str:
    """What a partition's task keys start with: a script that learns a task id (a leader's, a
    follower's) makes its key of it, in the same slot."""
    return f"{PREFIX}:{slot_tag(partition)}:task:"


def new_task_id(partition: int | None = None, partitions: int = 1) -> str:
    """112 random bits and this process's announcement tag as 32 hex digits: unguessable, and
    safe in URLs and keys.

    The last ``ANNOUNCE_TAG_LENGTH`` digits are the tag (``process_tag``): the task's end is
    announced on that process's channel. With ``partition``, the first 8 digits are nudged (by
    less than ``partitions``) so that the id falls in that partition: tasks that must share a
    slot (identical requests, for the result cache and request collapsing) land together, and
    about 108 bits stay random.
    """
    task_id = secrets.token_hex(16 - ANNOUNCE_TAG_LENGTH // 2) + process_tag()
    if partition is None:
        return task_id
    head = int(task_id[:8], 16)
    head += partition - head % partitions
    if head >= 1 << 32:
        head -= partitions
    return f"{head:08x}{task_id[8:]}"


_TAG = [secrets.token_hex(ANNOUNCE_TAG_LENGTH // 2)]  # this process's; a forked child redraws it
os.register_at_fork(after_in_child=lambda: _TAG.__setitem__(
    0, secrets.token_hex(ANNOUNCE_TAG_LENGTH // 2)))


def process_tag() -> str:
    """This process's announcement tag: random, drawn once per process (a forked child draws
    its own). Two processes that draw the same one each read the other's announcements too,
    which costs a little and breaks nothing."""
    return _TAG[0]


def announce_tag(task_id: str) -> str:
    """The tag of the process that made a task's id: its last digits."""
    return task_id[-ANNOUNCE_TAG_LENGTH:]


def done_channel(tag: str) -> str:
    """Where the ends of a process's tasks are announced: ``ferry:done:<tag>``."""
    return DONE_CHANNEL_PREFIX + tag


def done_shard_channel(tag: str, partition: int) -> str:
    """On a Redis Cluster, where one partition's scripts announce a process's task ends, in the
    partition's slot (sharded Pub/Sub): ``ferry:done:<tag>{p3}``."""
    return done_channel(tag) + slot_tag(partition)


def partition_of_digest(digest: str, partitions: int) -> int:
    """The partition of identical requests: from their digest's first 8 hex digits."""
    return int(digest[:8], 16) % partitions


def is_task_id(value: str) -> bool:
    return TASK_ID_PATTERN.fullmatch(value) is not None


def partition_of(task_id: str, partitions: int) -> int:
    """A task's partition: its id's first 8 hex digits modulo the partition count (random ids
    spread evenly; ``new_task_id`` can aim an id at a partition)."""
    return int(task_id[:8], 16) % partitions


def webhook_stream(partition: int) -> str:
    """Webhooks to send for a partition's tasks that ended with a callback URL."""
    return f"{PREFIX}:{slot_tag(partition)}:webhooks"


WEBHOOK_MAXLEN = 100_000  # approximate length cap of each partition's webhook stream


WEBHOOK_GROUP = "ferry-webhooks"


def cache_key(partition: int, digest: str) -> str:
    """A digest's key, in its slot: ``@<id>`` of the last task admitted for inference with that
    input (``=<id>`` if it has a deadline: it is not followed). While it is PENDING identical
    requests follow it; once it has a reusable answer its record is the cached answer, for the
    cache TTL."""
    return cache_key_prefix(partition) + digest


def cache_key_prefix(partition: int) -> str:
    """What a partition's digest keys start with (the completion script names a task's digest
    key from it, sparing a key argument per task)."""
    return f"{PREFIX}:{slot_tag(partition)}:cache:"


def followers_key(partition: int, task_id: str) -> str:
    """Identical requests waiting on a task's inference: ``<id> <created_at> <owner>`` each
    (the follower's head is ``tasks.record.FOLLOWER_HEAD`` of the first two)."""
    return followers_key_prefix(partition) + task_id


def followers_key_prefix(partition: int) -> str:
    """What a partition's followers lists start with (a script names a leader's list of it)."""
    return f"{PREFIX}:{slot_tag(partition)}:followers:"


JOB_ID_PATTERN = re.compile(r"^job_[0-9a-f]{24}$")
JOBS_ACTIVE = f"{PREFIX}:jobs:active"  # ids of jobs a runner must feed, cancel or finish


def new_job_id() -> str:
    return f"job_{secrets.token_hex(12)}"


def is_job_id(value: str) -> bool:
    return JOB_ID_PATTERN.fullmatch(value) is not None


def job_key(job_id: str, part: str = "job") -> str:
    """One of a job's keys, all in the job's own slot: ``job`` (its record, a hash), ``done`` (a
    bit per item whose result is committed), ``flight`` (items fed and not yet committed:
    index -> ``<task id> <line offset>``), ``segments`` (committed result files, a list),
    ``lease`` (the runner feeding it)."""
    return f"{PREFIX}:{{{job_id}}}:{part}"


def client_jobs_key(client_id: str) -> str:
    """A client's jobs, by creation time (a sorted set; '' is the anonymous client)."""
    return f"{PREFIX}:jobs:client:{{{client_id or '-'}}}"


def job_submission_key(client_id: str, idempotency_key: str) -> str:
    """The job a client's ``Idempotency-Key`` created (24 h): a repeat of the submit gets it."""
    return f"{PREFIX}:jobs:submitted:{{{client_id or '-'}}}:{idempotency_key}"


JOB_WEBHOOKS = f"{PREFIX}:jobs:webhooks"  # job state changes to POST (job_id, url, body)

# Rollouts (``ferry.rollouts``): every model's rollout in one hash, its generation beside it and
# its decisions' log, all in one slot (a change is one script); shadow pairs and comparison
# figures per model; per-version figures per (model, version, bucket).
ROLLOUTS = f"{PREFIX}:{{rollouts}}"  # model -> the rollout's JSON
ROLLOUT_GENERATIONS = f"{PREFIX}:{{rollouts}}:generation"  # model -> its generation
ROLLOUTS_DECLARED = f"{PREFIX}:{{rollouts}}:declared"  # model -> digest of the declaration
ROLLOUT_CHECKS = f"{PREFIX}:{{rollouts}}:checks"  # model -> the guard's last look (JSON)
ROLLOUT_LOG_LENGTH = 1000  # decisions kept per model
ROLLOUT_EXAMPLES = 100  # disagreeing shadow examples kept per (model, candidate)
VERSION_STATS_TTL_S = 3600  # how long a bucket of per-version figures is kept


def rollout_log_key(model: str) -> str:
    """A model's rollout decisions, newest first (same slot as ``ROLLOUTS``)."""
    return f"{PREFIX}:{{rollouts}}:log:{model}"


def shadow_pairs_key(model: str) -> str:
    """(primary, shadow) task id pairs waiting to be compared, scored by admission time."""
    return f"{PREFIX}:shadow:{{{model}}}:pairs"


def comparison_key(model: str, candidate: str, part: str = "figures") -> str:
    """A candidate's comparison with the stable version: ``figures`` (a hash of counts) or
    ``examples`` (disagreeing pairs, newest first)."""
    return f"{PREFIX}:shadow:{{{model}}}:{candidate}:{part}"


def version_stats_key(model: str, version: str, bucket: int) -> str:
    """One version's tally for one bucket of ``rollouts.window.BUCKET_S`` seconds."""
    return f"{PREFIX}:vstats:{{{model}:{version}}}:{bucket}"


def served_key(model: str) -> str:
    """Ferry's statistics of a model (``ferry.oip.statistics``): a hash of counts, never
    expired, as Triton keeps its own for as long as it runs."""
    return f"{PREFIX}:served:{{{model}}}"


def served_last_key(model: str) -> str:
    """When each version of the model last ended a batch (ms; a sorted set, same slot as
    ``served_key``)."""
    return f"{PREFIX}:served:{{{model}}}:last"


BUDGET_CHANNEL = f"{PREFIX}:budget"  # a model's name, when one of its shared slots frees


def budget_key(model: str, part: str) -> str:
    """A model's shared in-flight budget (``batcher.budget``), in one slot: ``slots`` (a sorted
    set of the slots taken, by when each lapses), ``queue`` (batchers waiting for one, by when
    each began to wait), ``seen`` (those batchers, by when each last asked)."""
    return f"{PREFIX}:budget:{{{model}}}:{part}"


# The inference log (``ferry.inference_log``, docs/inference-log.md): per logged model, in the
# model's own slot (a batch is of one model, so its hand-off is one script on one master, and
# on a Redis Cluster the models' logs spread over the masters), the stream the batchers hand
# sampled records to and the loggers drain, a ring of the latest records (``ferry log tail``)
# and a count of the records dropped because the stream was at its bound.
LOG_GROUP = "ferry-loggers"
LOG_RECENT = 100  # records kept per model for ``ferry log tail``
LOG_FIELD = "r"  # a log entry's one field: the record's JSON


def log_key(model: str, part: str = "stream") -> str:
    """One of a model's inference-log keys: ``stream`` (``ferry:log:{sim}``, the records for the
    loggers), ``recent`` (the latest ``LOG_RECENT``) or ``dropped`` (a count)."""
    base = f"{PREFIX}:log:{{{model}}}"
    return base if part == "stream" else f"{base}:{part}"
