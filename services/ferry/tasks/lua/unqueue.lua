-- Local functions that take a task back out of its queue, shared by cancel, expire and withdraw
-- (the loader puts this before each script that declares it, after common).

-- A follower leaves its leader's followers list (``list``), which goes on for the others.
local function unfollow(list, id)
  for _, follower in ipairs(redis.call('LRANGE', list, 0, -1)) do
    if string.sub(follower, 1, #id + 1) == id .. ' ' then redis.call('LREM', list, 1, follower) end
  end
end

-- A task that waited in a fair queue (``fair``, ``fairstate``: its queue and state; ``flow``)
-- leaves it: false if it is not there (a batcher moved it to the stream meanwhile).
local function unwait(fair, fairstate, flow, id, key)
  if redis.call('ZREM', fair, id) ~= 1 then return false end
  leave_flow(fairstate, flow)
  redis.call('HDEL', key, 'fair', 'fairstate', 'flow', 'envelope')
  return true
end

-- Whether the task left its queue unread (and its counts the backlog): false if a batcher of
-- ``group`` has read it, or it is not there. ``waiting``: its record's fair, fairstate, flow
-- and flowed (its flow's count, left with the model's).
local function unqueue(stream, entry, group, backlog, counted, held, waiting, id, key)
  if not entry and waiting and waiting[1] then
    if not unwait(waiting[1], waiting[2], waiting[3], id, key) then return false end
    leave(backlog, counted)
    leave(backlog, held)
    leave(backlog, waiting[4])
    return true
  end
  if not (entry and stream) then return false end
  if not take_unread(stream, group, entry) then return false end
  leave(backlog, counted)
  leave(backlog, held)
  if waiting then leave(backlog, waiting[4]) end
  return true
end

-- A PENDING task ended here (cancelled, expired) as ``status``: in its body, ``to`` for the
-- status fragment ``from`` (its first mention: right after the head, an id and a number) and
-- ``tail`` in place of the closing brace; kept for ``ttl``, its end announced, its webhook
-- (``url``) queued. The new body.
local function end_pending(key, id, body, from, to, tail, status, ttl, shard, webhooks, url)
  local at = string.find(body, from, 1, true)
  body = string.sub(body, 1, at - 1) .. to .. string.sub(body, at + #from, -2) .. tail
  redis.call('HSET', key, 'status', status, 'body', body)
  redis.call('EXPIRE', key, ttl)
  local frames = {}
  announce(frames, id, status, body, #body)
  publish_frames(frames, shard)
  queue_webhook(webhooks, id, url)
  return body
end
