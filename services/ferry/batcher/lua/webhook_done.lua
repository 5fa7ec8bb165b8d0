-- webhook_done: end a task's webhook: its outcome joins the task's record (the first outcome
-- only), and its entry is acknowledged and deleted from the webhook stream.
-- KEYS (DoneKeys): task (the task's hash), stream (its partition's webhook stream).
-- Named args (DoneArgs): group (the webhook consumer group), entry_id, outcome (JSON: the
--   record's "webhook" member).
-- Result: DONE_NOTED (the outcome joined the record), DONE_SKIPPED (no record any more, or it
--   holds an earlier outcome); the entry goes either way.
local noted = DONE_SKIPPED
local body = redis.call('HGET', task, 'body')
if body and redis.call('HSETNX', task, 'webhooked', '1') == 1 then
  redis.call('HSET', task, 'body', string.sub(body, 1, -2) .. ',"webhook":' .. outcome .. '}')
  noted = DONE_NOTED
end
redis.call('XACK', stream, group, entry_id)
redis.call('XDEL', stream, entry_id)
return noted
