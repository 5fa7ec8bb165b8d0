-- withdraw: take back an admission that replicas did not confirm in time (WAIT), unless a
-- batcher has it already. Either way the gateway answers 503 and the client retries.
-- KEYS (WithdrawKeys): task_key, backlog, followers (the task's own followers list).
-- Named args (WithdrawArgs): the task, the consumer group, the followers lists' prefix, and
--   hit ('1': the admission was answered from the cache, its record SUCCESS at once).
-- A follower leaves its leader's list; a queued task whose entry no batcher has read leaves its
-- stream and its backlog counts. Either way its record is deleted, as if it had never been.
-- A cache hit's record is deleted too. A task a batcher holds, one others follow, or one that
-- has ended since is kept (it runs, or stands, for nobody: its client was told to retry).
-- Result: WITHDRAW_GONE (the record was deleted, or was never here: a new master that did not
--   receive it), or WITHDRAW_KEPT.
local state = redis.call('HMGET', task_key, 'status', 'entry', 'stream', 'counted', 'held',
                         'leader', 'fair', 'fairstate', 'flow', 'flowed')
if not state[1] then return WITHDRAW_GONE end
if hit == '1' and state[1] == SUCCESS and not state[2] then
  redis.call('DEL', task_key)
  return WITHDRAW_GONE
end
if state[1] ~= PENDING then return WITHDRAW_KEPT end
if state[6] then
  unfollow(followers_prefix .. state[6], task_id)
elseif redis.call('LLEN', followers) > 0
    or not unqueue(state[3], state[2], group, backlog, state[4], state[5],
                   {state[7], state[8], state[9], state[10]}, task_id, task_key) then
  return WITHDRAW_KEPT
end
redis.call('DEL', task_key)
return WITHDRAW_GONE
