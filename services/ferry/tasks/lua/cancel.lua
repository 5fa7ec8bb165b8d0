-- cancel: end a task CANCELLED if no batcher has sent it to Triton.
-- KEYS (CancelKeys): task_key, backlog, followers (the task's own followers list), webhooks.
-- Named args (CancelArgs): the task and the asking client ('' any; another client's task is as
--   unknown as none), the consumer group, the result TTL, the cancel channel, and
--   what the owner of the record prepared: pending_status, the fragment to swap for
--   cancelled_status, and cancelled_tail, which ends the body in place of its closing brace.
-- A follower of an identical task's inference leaves its list and ends CANCELLED; a task that
-- others follow is not cancelled. A PENDING task whose entry no batcher has read (or that waits
-- in a fair queue) leaves its queue and its backlog counts and ends CANCELLED here. One a batcher holds is flagged and its
-- id published on cancel_channel, for the batcher to settle unless it has sent it to Triton.
-- Result: {OUTCOME_UNKNOWN}, {OUTCOME_FINAL, status, record}, {OUTCOME_CANCELLED, record},
--   {OUTCOME_SIGNALLED} or {OUTCOME_SHARED}.
local state = redis.call('HMGET', task_key, 'status', 'body', 'entry', 'stream', 'counted',
                         'owner', 'held', 'leader', 'callback', 'fair', 'fairstate', 'flow', 'flowed')
local status, body = state[1], state[2]

local function cancelled()
  return {OUTCOME_CANCELLED, end_pending(task_key, task_id, body, pending_status,
                                         cancelled_status, cancelled_tail, CANCELLED,
                                         result_ttl, shard, webhooks, state[9])}
end

if not status or (client_id ~= '' and state[6] ~= client_id) then return {OUTCOME_UNKNOWN} end
if status ~= PENDING then return {OUTCOME_FINAL, status, body} end
if state[8] then
  unfollow(followers_prefix .. state[8], task_id)
  return cancelled()
end
if redis.call('LLEN', followers) > 0 then return {OUTCOME_SHARED} end
if unqueue(state[4], state[3], group, backlog, state[5], state[7],
           {state[10], state[11], state[12], state[13]}, task_id, task_key) then
  return cancelled()
end
redis.call('HSET', task_key, 'cancel', '1')
redis.call('PUBLISH', cancel_channel, task_id)
return {OUTCOME_SIGNALLED}
