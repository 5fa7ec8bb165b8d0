"""Bulk jobs' records in Redis: each job's keys share one slot (``keys.job_key``), and every
change a runner makes is fenced by its lease, so a runner that lost its job (paused, partitioned)
can never write over the runner that took the job over.

What Redis holds per job is bounded: its record, a bit per item, the items in flight (at most the
job's window) and the names of its result segments. Inputs and results live in the blob store.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ferry import keys, lua
from ferry.jobs import scripts
from ferry.jobs.model import Counts, ItemStatus, JobRecord, JobStatus
from ferry.jobs.scripts import (
    CommitArgs,
    CommitItem,
    CommitKeys,
    Fence,
    Field,
    FlyArgs,
    FlyItem,
    FlyKeys,
    ForgetArgs,
    ForgetItem,
    ForgetKeys,
    LeaseArgs,
    LeaseKeys,
    MoveArgs,
    MoveKeys,
    ReleaseArgs,
    ReleaseKeys,
    SetFencedArgs,
    SetFencedKeys,
    job_keys,
)
from ferry.resp.client import Commands

SUBMISSION_KEY_TTL_S = 86400
COUNT_FIELDS = {status: f"n:{status.value}" for status in ItemStatus}

@dataclass(frozen=True)
class NewJob:
    """What a job is created with."""

    job_id: str
    model: str
    total: int
    client_id: str
    priority: int
    expires_at: float
    model_version: str = ""
    callback_url: str = ""
    timeout_s: float = 0.0


def _decode(flat: Sequence[Any]) -> dict[str, str]:
    return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}


def record_of(job_id: str, fields: dict[str, str]) -> JobRecord:
    """A job's public record, from its hash."""
    counts = Counts(int(fields.get("total", 0)),
                    *(int(fields.get(COUNT_FIELDS[s], 0)) for s in ItemStatus))
    stamps = {name[3:]: float(value) for name, value in fields.items()
              if name.startswith("at:")}
    files = {name[5:]: value for name, value in fields.items() if name.startswith("file:")}
    return JobRecord(job_id, JobStatus(fields["status"]), fields.get("model", ""), counts,
                     float(fields.get("created", 0)), fields.get("priority_label", "batch"),
                     fields.get("client", ""), fields.get("version", ""),
                     float(fields.get("expires", 0)), fields.get("reason", ""), stamps, files,
                     int(fields.get("attempts", 1)), fields.get("note", ""))


class JobStore:
    """Job records, leases and commits."""

    def __init__(self, client: Commands, *, record_ttl_s: int) -> None:
        self.client = client
        self.record_ttl_s = record_ttl_s
        self._set_fenced = client.register_script(lua.source(scripts.SET_FENCED))
        self._commit = client.register_script(lua.source(scripts.COMMIT))
        self._lease = client.register_script(lua.source(scripts.LEASE))
        self._release = client.register_script(lua.source(scripts.RELEASE))
        self._move = client.register_script(lua.source(scripts.MOVE))
        self._fly = client.register_script(lua.source(scripts.FLY))
        self._forget = client.register_script(lua.source(scripts.FORGET))

    async def create(self, job: NewJob, label: str) -> None:
        """Record a queued job and make it a runner's to feed (active first: a job is never
        queued with no runner to find it)."""
        now = time.time()
        await self.client.execute("SADD", keys.JOBS_ACTIVE, job.job_id)
        await self.client.execute(
            "HSET", keys.job_key(job.job_id), "status", JobStatus.QUEUED.value,
            "model", job.model, "version", job.model_version, "total", job.total,
            "client", job.client_id, "priority", job.priority, "priority_label", label,
            "expires", repr(job.expires_at), "created", repr(now), "callback", job.callback_url,
            "timeout", repr(job.timeout_s), "cursor", 0, "offset", 0, "attempts", 1,
            "at:validating", repr(now), "at:queued", repr(now))
        await self.client.execute("ZADD", keys.client_jobs_key(job.client_id), repr(now),
                                  job.job_id)
        await self._announce(job.job_id)

    async def fields(self, job_id: str) -> dict[str, str] | None:
        flat = await self.client.execute("HGETALL", keys.job_key(job_id))
        return _decode(flat) if flat else None

    async def read(self, job_id: str) -> JobRecord | None:
        fields = await self.fields(job_id)
        return record_of(job_id, fields) if fields else None

    async def listed(self, client_id: str, limit: int, before: float | None
                   ) -> list[JobRecord]:
        """A client's jobs, newest first, created before ``before`` (None: any)."""
        top = f"({before!r}" if before is not None else "+inf"
        ids = await self.client.execute("ZREVRANGEBYSCORE", keys.client_jobs_key(client_id),
                                        top, "-inf", "LIMIT", 0, limit)
        found = []
        for raw in ids:
            record = await self.read(raw.decode())
            if record is not None:
                found.append(record)
        return found

    async def unfinished(self, client_id: str) -> list[JobRecord]:
        ids = await self.client.execute("ZRANGE", keys.client_jobs_key(client_id), 0, -1)
        found = [await self.read(raw.decode()) for raw in ids]
        return [r for r in found if r is not None and not r.status.final]

    async def move(self, job_id: str, from_states: Sequence[JobStatus], to: JobStatus,
                   **fields: str | int | float) -> JobStatus | None:
        """Put the job in ``to`` if it is in one of ``from_states``; its state before (None: no
        such job)."""
        args = MoveArgs(from_states=" ".join(s.value for s in from_states), to_state=to.value,
                        stamp_field=f"at:{to.value}", stamp=repr(time.time()))
        moved = scripts.state_before(await self.client.execute(*self._move.command(
            job_keys(MoveKeys, job_id),
            [*args, *lua.items(Field(name, value) for name, value in fields.items())])))
        if moved in from_states:
            await self._announce(job_id)
        return moved

    async def _announce(self, job_id: str) -> None:
        """Queue the job's record as it is now for its webhook, if it has one (after the step
        that changed it: a runner that dies in between loses that one webhook)."""
        fields = await self.fields(job_id)
        if fields and fields.get("callback"):
            body = orjson.dumps(record_of(job_id, fields).to_json(time.time()))
            await self.client.execute("XADD", keys.JOB_WEBHOOKS, "MAXLEN", "~",
                                      keys.WEBHOOK_MAXLEN, "*", "job_id", job_id,
                                      "url", fields["callback"], "body", body)

    async def submitted(self, client_id: str, idempotency_key: str) -> str | None:
        """The job an earlier submit with this key created (None: none)."""
        found = await self.client.execute("GET", keys.job_submission_key(client_id,
                                                                          idempotency_key))
        return found.decode() if found is not None else None

    async def remember(self, client_id: str, idempotency_key: str, job_id: str) -> None:
        await self.client.execute("SET", keys.job_submission_key(client_id, idempotency_key),
                                  job_id, "NX", "EX", SUBMISSION_KEY_TTL_S)

    async def note(self, job_id: str, text: str) -> None:
        """Why a job is not moving (shown as its ``note`` until the next state change)."""
        await self.client.execute("HSET", keys.job_key(job_id), "note", text)

    async def activate(self, job_id: str) -> None:
        await self.client.execute("SADD", keys.JOBS_ACTIVE, job_id)

    async def active(self) -> list[str]:
        return sorted(raw.decode() for raw in
                      await self.client.execute("SMEMBERS", keys.JOBS_ACTIVE))

    async def retire(self, job_id: str) -> None:
        """A final job: no runner's any more; its keys expire after the record TTL."""
        ttl = self.record_ttl_s
        await self.client.pipeline([
            ("EXPIRE", keys.job_key(job_id, part), ttl)
            for part in ("job", "done", "flight", "segments")])
        await self.client.execute("SREM", keys.JOBS_ACTIVE, job_id)

    async def lease(self, job_id: str, token: str, ms: int) -> bool:
        """Take the job's lease, or keep it; False: another runner holds it, or no such job."""
        return scripts.fence(await self.client.execute(*self._lease.command(
            job_keys(LeaseKeys, job_id),
            LeaseArgs(token=token, ms=ms)))) is Fence.HELD

    async def release(self, job_id: str, token: str) -> None:
        await self.client.execute(*self._release.command(
            job_keys(ReleaseKeys, job_id), ReleaseArgs(token=token)))

    async def set_fenced(self, job_id: str, token: str, **fields: str | int | float) -> bool:
        return scripts.fence(await self.client.execute(*self._set_fenced.command(
            job_keys(SetFencedKeys, job_id),
            [*SetFencedArgs(token=token),
             *lua.items(Field(name, value) for name, value in fields.items())]))) is Fence.HELD

    async def fly(self, job_id: str, token: str, entries: Sequence[tuple[int, str, int]],
                  cursor: int, offset: int) -> bool:
        """Record items as in flight (index, task id, line offset) and move the cursor past
        them, in one step and before they are admitted: a runner that dies after admitting
        finds them. False: the lease is lost."""
        items = (FlyItem(item_index=index, entry=f"{task_id} {line_offset}")
                 for index, task_id, line_offset in entries)
        return scripts.fence(await self.client.execute(*self._fly.command(
            job_keys(FlyKeys, job_id),
            [*FlyArgs(token=token, cursor=cursor, offset=offset), *lua.items(items)]))
        ) is Fence.HELD

    async def flight(self, job_id: str) -> dict[int, tuple[str, int]]:
        flat = await self.client.execute("HGETALL", keys.job_key(job_id, "flight"))
        found = {}
        for index, value in _decode(flat).items():
            task_id, _, offset = value.partition(" ")
            found[int(index)] = (task_id, int(offset))
        return found

    async def done_bits(self, job_id: str) -> bytes:
        return bytes(await self.client.execute("GET", keys.job_key(job_id, "done")) or b"")

    async def commit(self, job_id: str, token: str, segment: str,
                     ended: Sequence[tuple[int, ItemStatus]]) -> bool:
        """Commit a written segment and the items it holds, once each; False: the lease is
        lost (nothing was written)."""
        items = (CommitItem(item_index=index, count_field=COUNT_FIELDS[status])
                 for index, status in ended)
        return scripts.fence(await self.client.execute(*self._commit.command(
            job_keys(CommitKeys, job_id),
            [*CommitArgs(token=token, segment=segment), *lua.items(items)]))) is Fence.HELD

    async def segments(self, job_id: str, start: int = 0) -> list[str]:
        return [raw.decode() for raw in await self.client.execute(
            "LRANGE", keys.job_key(job_id, "segments"), start, -1)]

    async def forget_done(self, job_id: str, token: str, indices: Sequence[int],
                          status: ItemStatus) -> bool:
        """For a retry: clear the done bits of ``indices`` (all ended ``status``), uncount them
        and rewind the cursor, so the runner feeds them again. False: the lease is lost."""
        return scripts.fence(await self.client.execute(*self._forget.command(
            job_keys(ForgetKeys, job_id),
            [*ForgetArgs(token=token, count_field=COUNT_FIELDS[status]),
             *lua.items(ForgetItem(index) for index in indices)]))) is Fence.HELD
