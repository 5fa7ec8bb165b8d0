-- admit: record new tasks PENDING and append each to its partition's stream, in one step: the
-- admissions that arrived while the last call was at Redis, each decided as if alone, in order.
-- KEYS, per task (AdmitKeys, bound by bind(n)): task_key, stream (its priority's stream of its
--   partition), backlog (the partition's counts per "<model>|<priority>" and per "@<client>"),
--   normal_stream (where a doorbell rings), bell_key (its priority's doorbell), digest_key ("@<id>"
--   of the last task admitted for inference with its input, "=<id>" if that one may not be
--   followed), webhooks, fair_queue, fair_state.
-- Named args (AdmitArgs): the TTLs, the doorbell's period, the batchers' group; then per task
--   (AdmitItem): the pending record and envelope, the limits, how it may share work (lookup,
--   collapse, hit_head), its callback and owner, and the prefixes of the task keys and followers
--   lists of its partition (for a leader's, known only here).
-- Before any limit the digest's task decides: if it ended with a reusable answer (its 'answer'
-- field: "<from> <to>" in its body) the task is SUCCESS at once, its record hit_head and that
-- answer; if it is PENDING, may be followed and is not being cancelled, the task follows it,
-- costing no backlog: the leader's followers list keeps "<id> <created> <owner>" (a format that
-- batchers and gateways of other versions read too: keep it across rolling upgrades).
-- A task of another priority than normal rings its partition's doorbell (at most once per
-- bell_ms): batchers block on the normal streams only, and read the others while rung.
-- Fair share (fair_after > 0): once its model's unfinished tasks of its priority in the
-- partition reach fair_after, or while others wait in the partition's fair queue, the task waits
-- there instead of in the stream, by start tag (start-time fair queueing: its flow, a client's
-- tasks of one model, starts at the later of the queue's virtual time and the flow's last
-- finish, and finishes cost / weight later); a batcher's fair read moves it to the stream in
-- that order (queue/lua/fair_read.lua). Its envelope waits in its record. The first task of an
-- empty fair queue rings the partition's normal stream (FAIR_FIELD) for the batchers to read it.
-- Deadline admission counts, of its own priority, only what a fair share puts ahead of it.
-- Result: for each task (an error reply for one whose step failed), {VERDICT_QUEUED, entry id
--   ('' in the fair queue)}, {VERDICT_HIT, record}, {VERDICT_COLLAPSED, leader id},
--   {VERDICT_BACKLOG_FULL, backlog}, {VERDICT_TOO_SLOW, predicted wait (s)} (the backlog ahead
--   of its priority / rate + fixed_wait, over timeout), {VERDICT_OWNER_FULL, owner's tasks}.
-- Set for each task: whether it may take a cached answer or follow, fair_after, and its flow's
-- field of the backlog hash: its unfinished tasks of its priority in the partition (kept as the
-- model's count is: the record's 'flowed' names it for the steps that end it).
local looking, collapsing, fair_from, flowed

-- Whether the task waits in the fair queue: fair share on, and the queue holds tasks already,
-- or its model's backlog of its priority here (``here``) has reached fair_after and holds
-- another flow's tasks too (``mine``: its own flow's), or has reached twice fair_after (a flow
-- alone is sent first come, first served, as cheaply as without fair share, until its backlog
-- is long enough to keep a newcomer waiting).
local function fair_wait(here, mine)
  if fair_from <= 0 then return false end
  if here >= 2 * fair_from or (here >= fair_from and here > mine) then return true end
  return redis.call('EXISTS', fair_queue) == 1
end

-- The fair queue as the task's flow sees it: the flow's tasks waiting there, and the weights
-- of the other flows waiting (the flow's own weight is ``weight``).
local function flows_waiting()
  local state = redis.call('HMGET', fair_state, 'n|' .. flow, 'w')
  local waiting, weights = tonumber(state[1]) or 0, tonumber(state[2]) or 0
  return waiting, math.max(0, weights - (waiting > 0 and tonumber(weight) or 0))
end

-- The entries of its priority's stream that no batcher has read yet: admitted first come,
-- first served before the contention began, they go before anything in the fair queue. (What a
-- batcher has read, it holds or has sent: the fixed wait counts that.)
local function unread()
  local pending = redis.pcall('XPENDING', stream, group)
  local read = type(pending) == 'table' and tonumber(pending[1]) or 0
  return math.max(0, redis.call('XLEN', stream) - read)
end

-- Of its own priority's ``here`` tasks, how many a fair share puts ahead of the task: the
-- stream's unread entries, then its flow's waiting tasks as many times over as its weight is a
-- part of the waiting flows' weights.
local function fair_ahead(here)
  if not fair_wait(here, tonumber(redis.call('HGET', backlog, flowed)) or 0) then
    return here
  end
  local waiting, others = flows_waiting()
  local mass = tonumber(weight)
  return math.min(here, unread() + (waiting + 1) * (others + mass) / mass)
end

-- With fair share, a full backlog refuses only the flows that hold their share of it: while
-- other flows wait in the fair queue, a flow whose own waiting tasks are fewer than its
-- weight's part of the limit is still admitted, so that a flood fills the backlog for itself
-- and nobody else (beyond the limit by at most the other flows' shares). A flow alone meets
-- the limit as it is.
local function within_share(at_most)
  if fair_from <= 0 then return false end
  local waiting, others = flows_waiting()
  local mass = tonumber(weight)
  if others <= mass * 1e-9 then return false end
  return waiting < at_most * mass / (others + mass)
end

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
  if at_most > 0 and unfinished >= at_most and not within_share(at_most) then
    return {VERDICT_BACKLOG_FULL, tostring(unfinished)}
  end
  if owner_field ~= '' and held_at_most > 0 and held >= held_at_most then
    return {VERDICT_OWNER_FULL, tostring(held)}
  end
  local per_s, within_s, level = tonumber(rate), tonumber(timeout), tonumber(priority)
  if within_s > 0 and per_s > 0 then
    local own = {[1] = high, [0] = normal, [-1] = low, [-2] = tonumber(counts[4]) or 0}
    local ahead = fair_ahead(own[level] or 0)
    if level < 1 then ahead = ahead + high end
    if level < 0 then ahead = ahead + normal end
    if level < -1 then ahead = ahead + low end
    local predicted = ahead / per_s + tonumber(fixed_wait)
    if predicted > within_s then return {VERDICT_TOO_SLOW, tostring(predicted)} end
  end
  return nil
end

-- The task waits in the fair queue, its place its flow's start tag.
local function wait_fair()
  local state = redis.call('HMGET', fair_state, 'v', 'f|' .. flow, 'n|' .. flow)
  local start = math.max(tonumber(state[1]) or 0, tonumber(state[2]) or 0)
  local mass = tonumber(weight)
  redis.call('HSET', fair_state, 'f|' .. flow, string.format('%.17g', start + tonumber(cost) / mass))
  if not state[3] then  -- the flow starts waiting: its weight joins the waiting flows'
    redis.call('HSET', fair_state, 'w|' .. flow, weight)
    redis.call('HINCRBYFLOAT', fair_state, 'w', weight)
  end
  redis.call('HINCRBY', fair_state, 'n|' .. flow, 1)
  redis.call('PEXPIRE', fair_state, FAIR_STATE_TTL_MS)
  if redis.call('ZADD', fair_queue, string.format('%.17g', start), task_id) == 1
      and redis.call('ZCARD', fair_queue) == 1 then
    append_entry(normal_stream, FAIR_FIELD, priority)
  end
  redis.call('HSET', task_key, 'fair', fair_queue, 'fairstate', fair_state, 'flow', flow,
             'envelope', envelope)
  return ''
end

local function queue()
  local counted = backlog_prefix .. priority
  local here = redis.call('HINCRBY', backlog, counted, 1) - 1
  local mine = redis.call('HINCRBY', backlog, flowed, 1) - 1
  local entry
  if fair_wait(here, mine) then
    entry = wait_fair()
  else
    entry = append_entry(stream, TASK_FIELD, envelope)
    redis.call('HSET', task_key, 'entry', entry, 'stream', stream)
  end
  redis.call('HSET', task_key, 'status', PENDING, 'body', pending_body, 'counted', counted,
             'flowed', flowed, 'callback', callback, 'owner', owner)
  if owner_field ~= '' then
    redis.call('HINCRBY', backlog, owner_field, 1)
    redis.call('HSET', task_key, 'held', owner_field)
  end
  redis.call('EXPIRE', task_key, pending_ttl)
  if priority ~= '0' and redis.call('SET', bell_key, '1', 'NX', 'PX', bell_ms) then
    append_entry(normal_stream, BELL_FIELD, priority)
  end
  if looking or collapsing then  -- identical requests find this task from now
    redis.call('SET', digest_key, (collapsing and '@' or '=') .. task_id, 'EX', pending_ttl)
  end
  return {VERDICT_QUEUED, entry}
end

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

-- A task that may share work: a cached answer, or the identical task in flight it follows.
local function shared_work()
  local leader, followable = digest_leader()
  if not leader then return nil end
  local leader_key = task_prefix .. leader
  local state = redis.pcall('HMGET', leader_key, 'status', 'body', 'answer', 'cancel')
  if type(state) ~= 'table' then state = {} end
  return answer_from_cache(state) or follow(leader, leader_key, state, followable)
end

local function decide()
  return (looking or collapsing) and shared_work() or refusal() or queue()
end

-- Each task's verdict; one that fails (Redis refused a write: out of memory...) is its own
-- error reply, and the call's other tasks are decided all the same.
local verdicts = {}
for n = 0, #KEYS / EACH_KEYS - 1 do
  bind(n)
  looking, collapsing = lookup == '1', collapse == '1'
  fair_from, flowed = tonumber(fair_after), '~' .. priority .. '|' .. flow
  local ok, verdict = pcall(decide)
  if not ok and type(verdict) ~= 'table' then verdict = redis.error_reply(tostring(verdict)) end
  verdicts[n + 1] = verdict
end
return verdicts
