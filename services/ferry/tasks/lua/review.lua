-- review: write a cascade's review's end into the record of the task it reviewed.
-- The record holds the review's pending entry (its exact bytes, ``marker``) in its head, put
-- there when that task ended; it is replaced by ``review``. The reusable answer's place
-- ('answer': "<from> <to>") moves with the bytes after it. With a callback URL, the reviewed
-- task's webhook is queued again (its record, with the review in it).
-- Result: 1 when written; 0 when the record has expired or holds no such pending entry (a
-- review that ended before, or a task run again since with a review of its own).
-- KEYS: the reviewed task's hash, its partition's webhook stream. ARGV: its id, the marker, the
-- review, its callback URL ('' none).
local body = redis.call('HGET', task_key, 'body')
if not body then return 0 end
local at = string.find(body, marker, 1, true)
if not at then return 0 end
redis.call('HSET', task_key, 'body',
           string.sub(body, 1, at - 1) .. review .. string.sub(body, at + #marker))
local place = redis.call('HGET', task_key, 'answer')
local from, to = string.match(place or '', '^(%d+) (%d+)$')
if from and tonumber(from) > at then
  local shift = #review - #marker
  redis.call('HSET', task_key, 'answer', (tonumber(from) + shift) .. ' ' .. (tonumber(to) + shift))
end
queue_webhook(webhooks, task_id, url)
return 1
