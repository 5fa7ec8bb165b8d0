-- expire: end a task EXPIRED once its deadline has passed without a final record, so that what
-- a client is answered at its deadline (a held call, a read) is what the record says for good.
-- The gateway runs it; the deadline is its to judge.
-- KEYS (ExpireKeys): task_key, backlog, followers (the task's own followers list), webhooks.
-- Named args (ExpireArgs): the task, the consumer group, the result TTL, and what the owner of
--   the record prepared: pending_status, the fragment to swap for expired_status, and
--   expired_tail, which ends the body in place of its closing brace; followers_prefix; shard
--   (as complete's).
-- A PENDING task nobody has read (or that waits in a fair queue) leaves its queue and its
-- counts. One a batcher holds stays with it, its counts leave here: the batcher finds the record
-- final, writes nothing more for it (the first answer stands) and acknowledges its entry. A
-- follower leaves its leader's list; a task that others follow is left to run for them.
-- Result: the final record's {status, body}; {} when the task is unknown or others follow it.
local state = redis.call('HMGET', task_key, 'status', 'body', 'entry', 'stream', 'counted',
                         'held', 'leader', 'callback', 'fair', 'fairstate', 'flow', 'flowed')
local status, body = state[1], state[2]
if not status then return {} end
if status ~= PENDING then return {status, body} end
if state[7] then
  unfollow(followers_prefix .. state[7], task_id)
elseif redis.call('LLEN', followers) > 0 then
  return {}
elseif not unqueue(state[4], state[3], group, backlog, state[5], state[6],
                   {state[9], state[10], state[11], state[12]}, task_id, task_key) then
  leave(backlog, state[5])
  leave(backlog, state[6])
  leave(backlog, state[12])
end
return {EXPIRED, end_pending(task_key, task_id, body, pending_status, expired_status,
                            expired_tail, EXPIRED, result_ttl, shard, webhooks, state[8])}
