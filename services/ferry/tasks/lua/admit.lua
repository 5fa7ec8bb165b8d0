-- admit: record a new task PENDING and append it to its partition's stream, in one step.
-- KEYS (AdmitKeys): task_key, stream (its priority's stream of its partition), backlog (the
--   partition's counts per "<model>|<priority>" and per "@<client>"), normal_stream (where a
--   doorbell rings), bell_key (its priority's doorbell), digest_key ("@<id>" of the last task
--   admitted for inference with its input, "=<id>" if that one may not be followed), webhooks.
-- Named args (AdmitArgs): the pending record and envelope, the limits, how it may share work
--   (lookup, collapse, hit_head), its callback and owner, and the prefixes of the task keys and
--   followers lists of its partition (for a leader's, known only here).
-- Before any limit the digest's task decides: if it ended with a reusable answer (its 'answer'
-- field: "<from> <to>" in its body) the task is SUCCESS at once, its record hit_head and that
-- answer; if it is PENDING, may be followed and is not being cancelled, the task follows it,
-- costing no backlog: the leader's followers list keeps "<id> <created> <owner>" (a format that
-- batchers and gateways of other versions read too: keep it across rolling upgrades).
-- A task of another priority than normal rings its partition's doorbell (at most once per
-- bell_ms): batchers block on the normal streams only, and read the others while rung.
-- Result: {VERDICT_QUEUED, entry id}, {VERDICT_HIT, record}, {VERDICT_COLLAPSED, leader id},
--   {VERDICT_BACKLOG_FULL, backlog}, {VERDICT_TOO_SLOW, predicted wait (s)} (the backlog ahead
--   of its priority / rate + fixed_wait, over timeout), {VERDICT_OWNER_FULL, owner's tasks}.
local looking, collapsing = lookup == '1', collapse == '1'

-- The first limit that refuses the task, as the result; nil when none does.
local function refusal()
  local counts = redis.call('HMGET', backlog, backlog_prefix .. '1', backlog_prefix .. '0',
                            backlog_prefix .. '-1', backlog_prefix .. '-2',
                            owner_field ~= '' and owner_field or backlog_prefix .. '0')
  local high, normal, low = tonumber(counts[1]) or 0, tonumber(counts[2]) or 0,
                            tonumber(counts[3]) or 0
  local at_most, held, held_at_most = tonumber(limit), tonumber(counts[5]) or 0,
                                      tonumber(owner_limit)
  -- Batch work (bulk jobs' items, priority -2) counts against its own share only: it never
  -- takes the backlog room of the interactive priorities.
  local unfinished = high + normal + low
  if priority == '-2' then unfinished = unfinished + (tonumber(counts[4]) or 0) end
  if at_most > 0 and unfinished >= at_most then
    return {VERDICT_BACKLOG_FULL, tostring(unfinished)}
  end
  if owner_field ~= '' and held_at_most > 0 and held >= held_at_most then
    return {VERDICT_OWNER_FULL, tostring(held)}
  end
  local per_s, within_s, level = tonumber(rate), tonumber(timeout), tonumber(priority)
  if within_s > 0 and per_s > 0 then
    local ahead = high
    if level <= 0 then ahead = ahead + normal end
    if level < 0 then ahead = ahead + low end
    if level < -1 then ahead = ahead + (tonumber(counts[4]) or 0) end
    local predicted = ahead / per_s + tonumber(fixed_wait)
    if predicted > within_s then return {VERDICT_TOO_SLOW, tostring(predicted)} end
  end
  return nil
end

local function queue()
  local counted = backlog_prefix .. priority
  redis.call('HINCRBY', backlog, counted, 1)
  local entry = redis.call('XADD', stream, '*', TASK_FIELD, envelope)
  redis.call('HSET', task_key, 'status', PENDING, 'body', pending_body, 'entry', entry,
             'stream', stream, 'counted', counted, 'callback', callback, 'owner', owner)
  if owner_field ~= '' then
    redis.call('HINCRBY', backlog, owner_field, 1)
    redis.call('HSET', task_key, 'held', owner_field)
  end
  redis.call('EXPIRE', task_key, pending_ttl)
  if priority ~= '0' and redis.call('SET', bell_key, '1', 'NX', 'PX', bell_ms) then
    redis.call('XADD', normal_stream, '*', BELL_FIELD, priority)
  end
  if looking or collapsing then  -- identical requests find this task from now
    redis.call('SET', digest_key, (collapsing and '@' or '=') .. task_id, 'EX', pending_ttl)
  end
  return {VERDICT_QUEUED, entry}
end

-- Only a task that may share work makes the functions that find the work to share: each
-- function a call makes costs Redis a closure.
local shared = false
if looking or collapsing then
  -- The digest's last task: its id and whether it may be followed; false if none (or unreadable).
  local function digest_leader()
    local found = redis.pcall('GET', digest_key)
    local kind = type(found) == 'string' and string.sub(found, 1, 1)
    if kind == '@' or kind == '=' then return string.sub(found, 2), kind == '@' end
    return false, false
  end

  -- The leader's reusable answer, as it was written and no more, ends the task at once.
  local function answer_from_cache(state)
    local from, to = string.match(state[3] or '', '^(%d+) (%d+)$')
    if not (looking and state[1] == SUCCESS and from) then return nil end
    local body = hit_head .. string.sub(state[2], tonumber(from), tonumber(to) - 1) .. '}'
    redis.call('HSET', task_key, 'status', SUCCESS, 'body', body, 'owner', owner)
    redis.call('EXPIRE', task_key, result_ttl)
    if callback ~= '' then
      redis.call('HSET', task_key, 'callback', callback)
      queue_webhook(webhooks, task_id, callback)
    end
    return {VERDICT_HIT, body}
  end

  -- The task waits on the leader's inference, and ends as it does (see complete.lua).
  local function follow(leader, leader_key, state, followable)
    if not (collapsing and followable and state[1] == PENDING and not state[4]) then return nil end
    local followers = followers_prefix .. leader
    redis.call('RPUSH', followers, task_id .. ' ' .. created .. ' ' .. owner)
    redis.call('EXPIRE', followers, pending_ttl)
    redis.call('HSET', leader_key, 'followed', '1')
    redis.call('HSET', task_key, 'status', PENDING, 'body', pending_body, 'leader', leader,
               'callback', callback, 'owner', owner)
    redis.call('EXPIRE', task_key, pending_ttl)
    return {VERDICT_COLLAPSED, leader}
  end

  local function shared_work()
    local leader, followable = digest_leader()
    if not leader then return nil end
    local leader_key = task_prefix .. leader
    local state = redis.pcall('HMGET', leader_key, 'status', 'body', 'answer', 'cancel')
    if type(state) ~= 'table' then state = {} end
    return answer_from_cache(state) or follow(leader, leader_key, state, followable)
  end

  shared = shared_work()
end
return shared or refusal() or queue()
