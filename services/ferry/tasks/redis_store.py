"""Task records in Redis hashes, written atomically with their queue entries by Lua scripts.

Admission is one script: the PENDING record and the stream entry. Completion is one script per
partition a batch touches, all sent in one round trip: the final records (unless one is there
already), the dead letters of failures, the acknowledgement and deletion of the entries, and one
``PUBLISH`` of what was written, bodies included when small, so that waiting clients are answered
without reading Redis again. Every key a script touches carries its partition's hash tag.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from ferry import keys
from ferry.codec import dumps, encode_task
from ferry.priority import BY_URGENCY, Priority
from ferry.resp.client import Arg, Command, Commands
from ferry.tasks.base import (
    NO_LIMITS,
    NO_OWNER,
    NOT_SHARED,
    Admission,
    Admitted,
    Cancellation,
    Completion,
    Owner,
    Sharing,
)
from ferry.tasks.record import Status, StoredRecord, TaskRecord, answer_at
from ferry.v1.task_pb2 import Task

INLINE_BODY_LIMIT = 16 * 1024  # larger results are announced by id alone and read on demand
CANCELLED_ERROR = "cancelled by the client before inference"

# KEYS: task hash, stream, backlog hash, the partition's normal stream, the priority's doorbell key,
# the digest's key ("@<id>" of the last task admitted for inference with that input).
# ARGV: pending body, pending TTL, envelope, backlog field prefix ("<model>|"), priority (1, 0,
# -1), limit (0: none), service rate per partition (tasks/s, 0: unknown), the wait besides the
# backlog (s), the client's timeout (s, 0: none), doorbell ms.
# A task of another priority than normal rings its partition's doorbell (at most once per
# doorbell period): batchers block on the normal streams only, and read the others while rung.
# Then: task id, the slot's key prefix ("ferry:{pN}:"), look up the cache ('1'/'0'), collapse
# ('1'/'0'), its creation time (JSON), result TTL, its callback URL ('' none: kept on the
# record, so whoever ends the task queues the webhook), the model's name as JSON (for a hit's
# record), its owner (the authenticated client, '' none:
# kept on the record so that only its owner may read or cancel it), the owner's backlog field
# ('' none: not counted) and that field's limit in this partition (0: none).
# Before any limit, the digest's task decides: if it ended with a reusable answer (its record's
# 'answer' field: where the answer starts and ends in its body) the task is SUCCESS at once
# ({2, body}); if it is still PENDING, may be followed ('@', not '=': a task with a deadline
# does not lead) and is not being cancelled, the task follows it, costing no backlog ({3, leader
# id}): the leader's followers list holds "<id> <created_at> <owner>".
# Predicted wait: the backlog ahead (this priority and higher) / rate + that fixed part.
# Returns {1, entry id}, {0, backlog} when the partition's backlog is at its limit,
# {-1, predicted wait} when the wait predicted for this priority exceeds the timeout, or
# {-2, the owner's unfinished tasks in the partition} when they are at the owner's limit.
_ADMIT = """
local slot, callback, owner, holder = ARGV[12], ARGV[17], ARGV[19], ARGV[20]
local lookup, collapse = ARGV[13] == '1', ARGV[14] == '1'
local leader, followable = false, false  -- the digest's last task: its answer, or its inference
if lookup or collapse then
  local found = redis.pcall('GET', KEYS[6])
  local kind = type(found) == 'string' and string.sub(found, 1, 1)
  if kind == '@' or kind == '=' then  -- else none, or unreadable: a miss
    leader, followable = string.sub(found, 2), kind == '@'
  end
end
if leader then
  local lkey = slot .. 'task:' .. leader
  local state = redis.pcall('HMGET', lkey, 'status', 'body', 'answer', 'cancel')
  if type(state) ~= 'table' then state = {} end
  local from, to = string.match(state[3] or '', '^(%d+) (%d+)$')
  if lookup and state[1] == 'SUCCESS' and from then  -- the answer as it was written, no more
    local body = '{"task_id":"' .. ARGV[11] .. '","created_at":' .. ARGV[15] ..
                 ',"status":"SUCCESS","model":' .. ARGV[18] .. ',"finished_at":' .. ARGV[15] ..
                 ',"cache":"hit"' .. string.sub(state[2], tonumber(from), tonumber(to) - 1) ..
                 '}'
    redis.call('HSET', KEYS[1], 'status', 'SUCCESS', 'body', body, 'owner', owner)
    redis.call('EXPIRE', KEYS[1], ARGV[16])
    if callback ~= '' then
      redis.call('HSET', KEYS[1], 'callback', callback)
      redis.call('XADD', slot .. 'webhooks', 'MAXLEN', '~', 100000, '*', 'task_id', ARGV[11],
                 'url', callback)
    end
    return {2, body}
  end
  if collapse and followable and state[1] == 'PENDING' and not state[4] then
    local followers = slot .. 'followers:' .. leader
    redis.call('RPUSH', followers, ARGV[11] .. ' ' .. ARGV[15] .. ' ' .. owner)
    redis.call('EXPIRE', followers, ARGV[2])
    redis.call('HSET', lkey, 'followed', '1')
    redis.call('HSET', KEYS[1], 'status', 'PENDING', 'body', ARGV[1], 'leader', leader,
               'callback', callback, 'owner', owner)
    redis.call('EXPIRE', KEYS[1], ARGV[2])
    return {3, leader}
  end
end
local prefix, priority = ARGV[4], tonumber(ARGV[5])
local counts = redis.call('HMGET', KEYS[3], prefix .. '1', prefix .. '0', prefix .. '-1',
                         holder ~= '' and holder or prefix .. '0')
local high, normal, low = tonumber(counts[1]) or 0, tonumber(counts[2]) or 0,
                          tonumber(counts[3]) or 0
local limit, held = tonumber(ARGV[6]), tonumber(counts[4]) or 0
if limit > 0 and high + normal + low >= limit then
  return {0, tostring(high + normal + low)}
end
if holder ~= '' and tonumber(ARGV[21]) > 0 and held >= tonumber(ARGV[21]) then
  return {-2, tostring(held)}
end
local rate, timeout = tonumber(ARGV[7]), tonumber(ARGV[9])
if timeout > 0 and rate > 0 then
  local ahead = high
  if priority <= 0 then ahead = ahead + normal end
  if priority < 0 then ahead = ahead + low end
  local predicted = ahead / rate + tonumber(ARGV[8])
  if predicted > timeout then
    return {-1, tostring(predicted)}
  end
end
redis.call('HINCRBY', KEYS[3], prefix .. ARGV[5], 1)
local entry = redis.call('XADD', KEYS[2], '*', 'task', ARGV[3])
redis.call('HSET', KEYS[1], 'status', 'PENDING', 'body', ARGV[1], 'entry', entry,
           'stream', KEYS[2], 'counted', prefix .. ARGV[5], 'callback', callback,
           'owner', owner)
if holder ~= '' then
  redis.call('HINCRBY', KEYS[3], holder, 1)
  redis.call('HSET', KEYS[1], 'held', holder)
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
if priority ~= 0 and redis.call('SET', KEYS[5], '1', 'NX', 'PX', ARGV[10]) then
  redis.call('XADD', KEYS[4], '*', 'bell', ARGV[5])
end
if lookup or collapse then  -- identical requests find this task from now ('=': not to follow)
  redis.call('SET', KEYS[6], (collapse and '@' or '=') .. ARGV[11], 'EX', ARGV[2])
end
return {1, entry}
"""

# KEYS: stream, dead-letter stream, backlog hash, then the hash of each item that has a task id.
# ARGV: group, result TTL, channel, dead-letter maxlen, inline limit, failed-at, the slot's key
# prefix, cache TTL (0: off), then 11 per item: entry id, task id ('' for an unreadable entry),
# status, body, dead-letter reason ('' if none), envelope (only for a dead letter), deliveries,
# backlog field ("<model>|<priority>"), digest ('' none), where a reusable answer starts in the
# body (0: not reusable), the callback URL ('' none). A task that ends with a callback queues its
# webhook here.
# A task that gets its final record leaves its model's backlog (and its owner's, if counted).
# A reusable answer is the cache: its record keeps where the answer starts and ends ('answer':
# "<from> <to>", 1-based), and the digest's key, if it still names the task, lives for the cache
# TTL from now. The key of a task whose answer is not reusable is deleted, if it names the task.
# The first final answer stands: an item whose record is already final writes nothing; an
# unreadable entry (no record to check) is dead-lettered only by the step that acknowledges it.
# Announcement frames: "<task id> <status> <n> <body of n bytes>", n = 0: body not inlined.
_COMPLETE = """
local group, ttl, channel, maxlen = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local inline, now = tonumber(ARGV[5]), ARGV[6]
local slot, cache_ttl = ARGV[7], tonumber(ARGV[8])
local written, ids, acks, frames, k = {}, {}, {}, {}, 4
for i = 9, #ARGV, 11 do
  local entry, id, status, body = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  ids[#ids + 1] = entry
  local fresh
  if id == '' then  -- unreadable: only the step that acknowledges it dead-letters it
    fresh = redis.call('XACK', KEYS[1], group, entry)
  else
    acks[#acks + 1] = entry
    fresh = 1
    local key = KEYS[k]
    k = k + 1
    local state = redis.call('HMGET', key, 'status', 'followed', 'held')
    if state[1] and state[1] ~= 'PENDING' then
      fresh = 0
    else
      local digest, answer = ARGV[i + 8], ARGV[i + 9]
      local reused = digest ~= '' and answer ~= '0' and cache_ttl > 0
      if reused then  -- where the answer is in the body: later additions are not part of it
        redis.call('HSET', key, 'status', status, 'body', body, 'answer', answer .. ' ' .. #body)
      else
        redis.call('HSET', key, 'status', status, 'body', body)
      end
      redis.call('EXPIRE', key, ttl)
      if redis.call('HINCRBY', KEYS[3], ARGV[i + 7], -1) < 0 then
        redis.call('HSET', KEYS[3], ARGV[i + 7], 0)  -- a lost count: never below none
      end
      if state[3] and redis.call('HINCRBY', KEYS[3], state[3], -1) < 0 then
        redis.call('HSET', KEYS[3], state[3], 0)
      end
      if #body <= inline then
        frames[#frames + 1] = id .. ' ' .. status .. ' ' .. #body .. ' ' .. body
      else
        frames[#frames + 1] = id .. ' ' .. status .. ' 0 '
      end
      if ARGV[i + 10] ~= '' then  -- the task ended: queue its webhook (a batcher sends it)
        redis.call('XADD', slot .. 'webhooks', 'MAXLEN', '~', 100000, '*', 'task_id', id,
                   'url', ARGV[i + 10])
      end
      if digest ~= '' then
        local shared = slot .. 'cache:' .. digest
        local named = redis.pcall('GET', shared)
        if named == '@' .. id or named == '=' .. id then  -- else it names a later task by now
          if reused then
            redis.call('EXPIRE', shared, cache_ttl)
          else
            redis.call('DEL', shared)
          end
        end
      end
      if state[2] then  -- identical requests follow it: they end as it did
        local fkey = slot .. 'followers:' .. id
        local tail = string.sub(body, (string.find(body, ',"status":', 1, true)))
        local lowner = redis.call('HGET', key, 'owner') or ''
        for _, follower in ipairs(redis.call('LRANGE', fkey, 0, -1)) do
          local fid, created, fowner = string.match(follower, '^(%S+) (%S+) ?(%S*)$')
          local fkey2 = slot .. 'task:' .. (fid or '')
          if fid and redis.call('HGET', fkey2, 'status') == 'PENDING' then
            local into = ''  -- another client's task is never named, only its answer shared
            if fowner == lowner then into = ',"collapsed_into":"' .. id .. '"' end
            local fbody = '{"task_id":"' .. fid .. '","created_at":' .. created .. into .. tail
            redis.call('HSET', fkey2, 'status', status, 'body', fbody)
            redis.call('EXPIRE', fkey2, ttl)
            if #fbody <= inline then
              frames[#frames + 1] = fid .. ' ' .. status .. ' ' .. #fbody .. ' ' .. fbody
            else
              frames[#frames + 1] = fid .. ' ' .. status .. ' 0 '
            end
            local url = redis.call('HGET', fkey2, 'callback')
            if url and url ~= '' then
              redis.call('XADD', slot .. 'webhooks', 'MAXLEN', '~', 100000, '*',
                         'task_id', fid, 'url', url)
            end
          end
        end
        redis.call('DEL', fkey)
      end
    end
  end
  if fresh == 1 and ARGV[i + 4] ~= '' then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'task', ARGV[i + 5],
               'error', ARGV[i + 4], 'stream', KEYS[1], 'entry_id', entry, 'failed_at', now,
               'task_id', id, 'model', string.match(ARGV[i + 7], '^(.*)|[^|]*$') or '',
               'deliveries', ARGV[i + 6])
  end
  written[#written + 1] = fresh
end
if #acks > 0 then
  redis.call('XACK', KEYS[1], group, unpack(acks))
end
redis.call('XDEL', KEYS[1], unpack(ids))
if #frames > 0 then
  redis.call('PUBLISH', channel, table.concat(frames))
end
return written
"""

# KEYS: task hash, backlog hash. ARGV: group, result TTL, done channel, cancel channel, finished
# at, error, task id, the slot's key prefix, the asking client ('' any; another client's task is
# as unknown as no task). A follower of an identical task's inference leaves
# its list and ends CANCELLED; a task others follow cannot be cancelled: {4}. A PENDING task
# whose entry no batcher has read is deleted from its stream and ends CANCELLED here: {2, body}.
# One a batcher holds is flagged and its id published on the cancel channel, for the batcher to
# settle if it has not sent it to Triton: {3}. A final task: {1, status, body}; none: {0}.
_CANCEL = """
local state = redis.call('HMGET', KEYS[1], 'status', 'body', 'entry', 'stream', 'counted',
                        'owner', 'held')
local status, body, entry, stream, counted = state[1], state[2], state[3], state[4], state[5]
if not status or (ARGV[9] ~= '' and state[6] ~= ARGV[9]) then return {0} end
if status ~= 'PENDING' then return {1, status, body} end
local function cancelled()
  body = string.gsub(body, '"status":"PENDING"', '"status":"CANCELLED"', 1)
  body = string.sub(body, 1, -2) .. ',"finished_at":' .. ARGV[5] .. ',"error":"' .. ARGV[6] ..
         '"}'
  redis.call('HSET', KEYS[1], 'status', 'CANCELLED', 'body', body)
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[7] .. ' CANCELLED ' .. #body .. ' ' .. body)
  local url = redis.call('HGET', KEYS[1], 'callback')
  if url and url ~= '' then
    redis.call('XADD', ARGV[8] .. 'webhooks', 'MAXLEN', '~', 100000, '*', 'task_id', ARGV[7],
               'url', url)
  end
  return {2, body}
end
local leader = redis.call('HGET', KEYS[1], 'leader')
if leader then  -- a follower: it leaves its leader's list, which goes on for the others
  local fkey = ARGV[8] .. 'followers:' .. leader
  for _, follower in ipairs(redis.call('LRANGE', fkey, 0, -1)) do
    if string.sub(follower, 1, #ARGV[7]) == ARGV[7] then redis.call('LREM', fkey, 1, follower) end
  end
  return cancelled()
end
if redis.call('LLEN', ARGV[8] .. 'followers:' .. ARGV[7]) > 0 then
  return {4}
end
if entry and stream then
  local held = redis.pcall('XPENDING', stream, ARGV[1], entry, entry, 1)
  if held.err then held = {} end  -- no consumer group yet: no batcher has read anything
  if #held == 0 and redis.call('XDEL', stream, entry) == 1 then
    for _, field in ipairs({counted or false, state[7] or false}) do
      if field and redis.call('HINCRBY', KEYS[2], field, -1) < 0 then
        redis.call('HSET', KEYS[2], field, 0)
      end
    end
    return cancelled()
  end
end
redis.call('HSET', KEYS[1], 'cancel', '1')
redis.call('PUBLISH', ARGV[4], ARGV[7])
return {3}
"""

# KEYS: a partition's streams, then its backlog hash. With no unfinished entry in any of the
# streams the partition has no backlog: counts left by a lost write are reset.
_HEAL = """
local n = 0
for i = 1, #KEYS - 1 do n = n + redis.call('XLEN', KEYS[i]) end
if n == 0 then return redis.call('DEL', KEYS[#KEYS]) end
return 0
"""


@functools.lru_cache(maxsize=1024)
def model_json(model: str) -> bytes:
    return dumps(model)


class RedisTaskStore:
    """Task records and their lifecycle, over the lean pipelined client."""

    def __init__(self, client: Commands, *, partitions: int, result_ttl_s: int,
                 pending_ttl_s: int, dead_letter_maxlen: int = 100_000,
                 inline_limit: int = INLINE_BODY_LIMIT, cache_ttl_s: int = 0) -> None:
        self.client = client
        self.partitions = partitions
        self.result_ttl_s = result_ttl_s
        self.pending_ttl_s = pending_ttl_s
        self.dead_letter_maxlen = dead_letter_maxlen
        self.inline_limit = inline_limit
        self.cache_ttl_s = cache_ttl_s
        self._admit = client.register_script(_ADMIT)
        self._complete = client.register_script(_COMPLETE)
        self._heal = client.register_script(_HEAL)
        self._cancel = client.register_script(_CANCEL)

    def key(self, task_id: str) -> str:
        return keys.task_key(task_id, keys.partition_of(task_id, self.partitions))

    async def admit(self, task: Task, pending: TaskRecord, admission: Admission = NO_LIMITS,
                    sharing: Sharing = NOT_SHARED, owner: Owner = NO_OWNER) -> Admitted:
        partition = keys.partition_of(task.task_id, self.partitions)
        priority = Priority.of(task.priority)
        body = pending.body()
        digest = sharing.digest
        limits, rate, fixed_wait, timeout = admission.script_args
        verdict, value = await self.client.execute(*self._admit.command(
            [keys.task_key(task.task_id, partition), keys.partition_stream(partition, priority),
             keys.backlog_key(partition), keys.partition_stream(partition),
             keys.bell_key(partition, priority), keys.cache_key(partition, digest)],
            [body, self.pending_ttl_s, encode_task(task), f"{task.model}|", int(priority),
             limits[partition] if admission.limit else 0, rate, fixed_wait, timeout,
             keys.BELL_MS, task.task_id,
             keys.slot_prefix(partition),
             int(bool(digest) and sharing.lookup), int(bool(digest) and sharing.collapse),
             sharing.created, self.result_ttl_s, task.callback_url,
             model_json(task.model), owner.client_id, owner.field,
             owner.pending_limit(partition, self.partitions)]))
        if verdict == 0:
            raise admission.backlog_full(task.model, priority, int(value))
        if verdict == -2:
            raise owner.too_many(int(value), self.partitions)
        if verdict == -1:
            raise admission.too_slow(task.model, priority, float(value))
        if verdict == 2:
            return Admitted(StoredRecord(Status.SUCCESS, bytes(value)), "hit")
        return Admitted(StoredRecord(pending.status, body),
                        "collapsed" if verdict == 3 else "queued")

    async def read(self, task_id: str) -> StoredRecord | None:
        status, body = await self.client.execute("HMGET", self.key(task_id), "status", "body")
        if status is None or body is None:
            return None
        return StoredRecord(Status(status.decode()), body)

    async def read_owned(self, task_id: str, client_id: str) -> StoredRecord | None:
        """The record if the task belongs to ``client_id``: another client's task is as unknown
        as no task."""
        status, body, owner = await self.client.execute("HMGET", self.key(task_id), "status",
                                                        "body", "owner")
        if status is None or body is None or owner != client_id.encode():
            return None
        return StoredRecord(Status(status.decode()), body)

    async def complete(self, completions: Sequence[Completion]) -> list[bool]:
        if not completions:
            return []
        groups: dict[tuple[int, str], list[int]] = {}
        for index, completion in enumerate(completions):
            delivery = completion.delivery
            groups.setdefault((delivery.partition, delivery.stream), []).append(index)
        now = repr(time.time())
        commands = [self._completion(partition, stream, [completions[i] for i in indexes], now)
                    for (partition, stream), indexes in groups.items()]
        replies = await self.client.pipeline(commands)
        written = [False] * len(completions)
        for indexes, flags in zip(groups.values(), replies, strict=True):
            for index, flag in zip(indexes, flags, strict=True):
                written[index] = bool(flag)
        return written

    def _completion(self, partition: int, stream: str, items: Sequence[Completion],
                    now: str) -> Command:
        script_keys: list[Arg] = [stream, keys.dead_letter_stream(partition),
                                  keys.backlog_key(partition)]
        args: list[Arg] = [keys.CONSUMER_GROUP, self.result_ttl_s, keys.DONE_CHANNEL,
                           self.dead_letter_maxlen, self.inline_limit, now,
                           keys.slot_prefix(partition), self.cache_ttl_s]
        for item in items:
            delivery, record = item.delivery, item.record
            if record is not None:
                script_keys.append(keys.task_key(record.task_id, partition))
            task = delivery.task
            field = keys.backlog_field(task.model, Priority.of(task.priority)) if task else ""
            body = record.body() if record else b""
            args += [delivery.entry_id, record.task_id if record else "",
                     record.status.value if record else "", body,
                     item.dead_letter or "", delivery.raw if item.dead_letter else b"",
                     delivery.deliveries, field, task.input_digest if task else "",
                     answer_at(body) if item.reusable else 0,
                     task.callback_url if task else ""]
        return self._complete.command(script_keys, args)

    async def cancel(self, task_id: str, client_id: str = "") -> Cancellation:
        """Cancel a task that has not reached Triton (see ``Cancellation``); with ``client_id``,
        only a task of that client."""
        partition = keys.partition_of(task_id, self.partitions)
        reply = await self.client.execute(*self._cancel.command(
            [keys.task_key(task_id, partition), keys.backlog_key(partition)],
            [keys.CONSUMER_GROUP, self.result_ttl_s, keys.DONE_CHANNEL, keys.CANCEL_CHANNEL,
             repr(time.time()), CANCELLED_ERROR, task_id, keys.slot_prefix(partition),
             client_id]))
        outcome = int(reply[0])
        if outcome == 1:
            return Cancellation(outcome, StoredRecord(Status(reply[1].decode()), reply[2]))
        if outcome == 2:
            return Cancellation(outcome, StoredRecord(Status.CANCELLED, reply[1]))
        return Cancellation(outcome, None)

    async def cancel_requested(self, task_ids: Sequence[str]) -> list[bool]:
        """Whether each task was flagged for cancellation (for tasks a batcher reclaims)."""
        if not task_ids:
            return []
        replies = await self.client.pipeline([("HGET", self.key(t), "cancel") for t in task_ids])
        return [reply is not None for reply in replies]

    async def heal_backlog(self, partitions: Sequence[int]) -> int:
        """Reset the backlog counts of partitions that have no unfinished task; how many were."""
        if not partitions:
            return 0
        replies = await self.client.pipeline([
            self._heal.command([*keys.partition_streams(p), keys.backlog_key(p)], [])
            for p in partitions])
        return sum(int(r) for r in replies)

    async def backlog(self, model: str) -> dict[Priority, int]:
        """The model's unfinished tasks by priority, over all partitions."""
        fields = [keys.backlog_field(model, p) for p in BY_URGENCY]
        replies = await self.client.pipeline([
            ("HMGET", keys.backlog_key(p), *fields) for p in range(self.partitions)])
        totals = dict.fromkeys(BY_URGENCY, 0)
        for counts in replies:
            for priority, count in zip(BY_URGENCY, counts, strict=True):
                totals[priority] += int(count or 0)
        return totals
