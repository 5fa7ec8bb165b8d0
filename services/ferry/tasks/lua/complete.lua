-- complete: settle one batch's deliveries of one or more streams (every stream of the batch on
-- one Redis; a partition's on a Redis Cluster, whose scripts keep to one slot): final records
-- (unless one is there already: the first answer stands), dead letters, acknowledgement and
-- deletion of the entries, and one PUBLISH announcing the records written (inline when small)
-- per channel of the processes that made their tasks' ids (keys.done_channel).
-- KEYS: per stream (CompleteKeys, bound by bind(n)): stream, dead_letters, backlog, webhooks;
--   then the task key of each item that has a task id, in order.
-- Named args (CompleteArgs), then per stream (CompleteStream: its prefixes, ledger and number
--   of deliveries, entries), then one group of ITEM_SIZE per delivery, in the streams' order
--   (CompleteItem; ARGV[i + BODY] is item i's body). An item's digest key, followers list and
--   followers' task keys are named from cache_prefix, followers_prefix and task_prefix: known
--   only here (followers), or not worth a key argument per task.
-- A task that gets its final record leaves its model's backlog (and its owner's, if counted),
-- and queues its webhook if it has a callback. A reusable answer is the cache: its record keeps
-- where the answer starts and ends ('answer': "<from> <to>", 1-based), and the digest's key, if
-- it still names the task, lives cache_ttl from now; otherwise that key goes. Identical requests
-- that follow the task end as it did. An unreadable entry (task_id '': no record to check) is
-- dead-lettered only by the step that acknowledges it.
-- The usage ledger (ferry.usage.ledger): a task whose final record this call writes is counted
-- once in the partition's hash for the hour (ledger, in the stream's slot), under its item's
-- ledger_field followed by each measure: one task, its rows, its GPU microseconds. A duplicate
-- delivery writes no record, so it is never counted twice; the hash lives ledger_ttl from its
-- last count.
-- Result: for each item, 1 if this call wrote its final record (or acknowledged it), else 0;
-- or the first error of a stream that failed (after the others were settled and announced).
local inline, reuse_ttl = tonumber(inline_limit), tonumber(cache_ttl)
local frames = {}
local charged = false

-- What item i's task cost, in the ledger: counted only by the step that writes its record.
local function charge(i)
  local field, rows, gpu_us = ARGV[i + LEDGER_FIELD], ARGV[i + ROWS], ARGV[i + GPU_US]
  if field == '' then return end
  redis.call('HINCRBY', ledger, field .. LEDGER_TASKS, 1)
  if rows ~= '0' then redis.call('HINCRBY', ledger, field .. LEDGER_ROWS, rows) end
  if gpu_us ~= '0' then redis.call('HINCRBY', ledger, field .. LEDGER_GPU_US, gpu_us) end
  charged = true
end

-- The digest's key follows the task's answer: kept for the cache TTL, or gone.
local function settle_digest(id, digest, reused)
  if digest == '' then return end
  local key = cache_prefix .. digest
  local named = redis.pcall('GET', key)
  if named ~= '@' .. id and named ~= '=' .. id then return end  -- it names a later task by now
  if reused then
    redis.call('EXPIRE', key, reuse_ttl)
  else
    redis.call('DEL', key)
  end
end

-- Each follower's record: its own head (from its list entry "<id> <created> <owner>"), then
-- collapsed_into when it has the leader's owner (another client's task is never named, only its
-- answer shared), then the leader's shared part.
local function end_followers(id, key, status, shared)
  local list = followers_prefix .. id
  local leader_owner = redis.call('HGET', key, 'owner') or ''
  for _, follower in ipairs(redis.call('LRANGE', list, 0, -1)) do
    local fid, created, fowner = string.match(follower, '^(%S+) (%S+) ?(%S*)$')
    local fkey = task_prefix .. (fid or '')
    if fid and redis.call('HGET', fkey, 'status') == PENDING then
      local into = fowner == leader_owner and string.format(collapsed_into, id) or ''
      local body = string.format(follower_head, fid, created) .. into .. shared
      redis.call('HSET', fkey, 'status', status, 'body', body)
      redis.call('EXPIRE', fkey, result_ttl)
      announce(frames, fid, status, body, inline)
      queue_webhook(webhooks, fid, redis.call('HGET', fkey, 'callback'))
    end
  end
  redis.call('DEL', list)
end

-- Item i's final record, unless its task has one: 1 written, 0 not.
local function finish(i, key)
  local state = redis.call('HMGET', key, 'status', 'followed', 'held', 'flowed')
  if state[1] and state[1] ~= PENDING then return 0 end
  local id, status, body = ARGV[i + TASK_ID], ARGV[i + STATUS], ARGV[i + BODY]
  local answer, digest = ARGV[i + ANSWER_FROM], ARGV[i + DIGEST]
  local reused = digest ~= '' and answer ~= '0' and reuse_ttl > 0
  if reused then  -- where the answer is in the body: later additions are not part of it
    redis.call('HSET', key, 'status', status, 'body', body, 'answer', answer .. ' ' .. #body)
  else
    redis.call('HSET', key, 'status', status, 'body', body)
  end
  redis.call('EXPIRE', key, result_ttl)
  leave(backlog, ARGV[i + BACKLOG_FIELD])
  leave(backlog, state[3])
  leave(backlog, state[4])  -- its flow's count (fair share's)
  announce(frames, id, status, body, inline)
  queue_webhook(webhooks, id, ARGV[i + CALLBACK])
  settle_digest(id, digest, reused)
  charge(i)
  if state[2] then
    end_followers(id, key, status, string.sub(body, tonumber(ARGV[i + HEAD_END]) + 1))
  end
  return 1
end

local function dead_letter(i)
  redis.call('XADD', dead_letters, 'MAXLEN', '~', dead_letter_maxlen, '*',
             TASK_FIELD, ARGV[i + ENVELOPE], 'error', ARGV[i + DEAD_LETTER], 'stream', stream,
             'entry_id', ARGV[i + ENTRY_ID], 'failed_at', failed_at,
             'task_id', ARGV[i + TASK_ID],
             'model', string.match(ARGV[i + BACKLOG_FIELD], '^(.*)|[^|]*$') or '',
             'deliveries', ARGV[i + DELIVERIES])
end

-- One stream's ``entries`` deliveries, its items from ARGV[i] and task keys from KEYS[k] on:
-- written flags appended to ``written``; where the next stream's items and keys start.
local function settle(written, i, k)
  local ids, acks = {}, {}
  for _ = 1, tonumber(entries) do
    local entry, fresh = ARGV[i + ENTRY_ID], nil
    ids[#ids + 1] = entry
    if ARGV[i + TASK_ID] == '' then  -- unreadable: only the step that acknowledges it letters it
      fresh = ack_entry(stream, group, entry)
    else
      acks[#acks + 1] = entry
      fresh, k = finish(i, KEYS[k]), k + 1
    end
    if fresh == 1 and ARGV[i + DEAD_LETTER] ~= '' then dead_letter(i) end
    written[#written + 1] = fresh
    i = i + ITEM_SIZE
  end
  drop_entries(stream, group, acks, ids)
  if charged then redis.call('EXPIRE', ledger, ledger_ttl) end
  charged = false
  return i, k
end

-- Past a stream whose settling failed: where the next stream's items and keys start.
local function skip(i, k)
  for _ = 1, tonumber(entries) do
    if ARGV[i + TASK_ID] ~= '' then k = k + 1 end
    i = i + ITEM_SIZE
  end
  return i, k
end

-- A stream that fails (Redis refused a write) leaves the others settled and announced; the
-- call then answers the error, and the batcher settles the batch again (the records written
-- stand: the first answer stands).
local written, groups, failure = {}, tonumber(streams), nil
local i, k = NAMED_ARGS + groups * EACH_ARGS + 1, groups * EACH_KEYS + 1
for n = 0, groups - 1 do
  bind(n)
  local ok, next_i, next_k = pcall(settle, written, i, k)
  if not ok then
    failure = failure or next_i
    next_i, next_k = skip(i, k)
  end
  i, k = next_i, next_k
end
publish_frames(frames, shard)
if failure then
  return type(failure) == 'table' and failure or redis.error_reply(tostring(failure))
end
return written
