-- budget_take: a slot of a model's shared in-flight budget for one batcher, or its place in the
-- queue of batchers waiting for one. A slot is one batch at one Triton server; each server
-- takes as many of the model's batches as it runs instances (the caller's ``limits``, read
-- from the servers' configurations). Slots lapse ``lease_ms`` after they were taken or last
-- renewed (a batcher that died frees its slots within a lease); waiters that have not asked
-- for ``patience_ms`` leave the queue (a waiter asks again at least that often).
-- Waiting is first come, first served: a batcher gets a slot only when fewer batchers wait
-- ahead of it than there are free slots, so a freed slot goes to whoever waited longest (the
-- batch it sends holds everything that boarded meanwhile: the batch one queue would make).
-- KEYS (TakeKeys): slots, queue, seen. Named args (TakeArgs): consumer, token, lease_ms,
--   patience_ms; then per server (TakeItem): endpoint, limit.
-- Result: {1, endpoint} (taken: the slot is ``endpoint|token``), or {0, waiting ahead}.
local function prune(now_ms)
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now_ms)
  local stale = redis.call('ZRANGEBYSCORE', seen, '-inf', now_ms - tonumber(patience_ms))
  for _, gone in ipairs(stale) do
    redis.call('ZREM', queue, gone)
    redis.call('ZREM', seen, gone)
  end
end

-- The free slots over every server, and the server with the most room (the caller shuffles
-- the servers: of those with as much room, the first).
local function room()
  local used = {}
  for _, slot in ipairs(redis.call('ZRANGE', slots, 0, -1)) do
    local endpoint = string.match(slot, '^(.*)|[^|]*$')
    used[endpoint] = (used[endpoint] or 0) + 1
  end
  local free, best, best_room = 0, nil, 0
  for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
    local endpoint, limit = ARGV[i + ENDPOINT], tonumber(ARGV[i + LIMIT])
    local left = limit - (used[endpoint] or 0)
    if left > 0 then
      free = free + left
      if left > best_room then
        best, best_room = endpoint, left
      end
    end
  end
  return free, best
end

local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])  -- the queue's order: no two
local now_ms = math.floor(now_us / 1000)  -- scripts run in one microsecond
local ttl = tonumber(lease_ms) * 10
prune(now_ms)
local free, best = room()
local ahead = redis.call('ZRANK', queue, consumer)
if ahead == false then
  ahead = redis.call('ZCARD', queue)
end
if best == nil or ahead >= free then
  redis.call('ZADD', queue, 'NX', now_us, consumer)
  redis.call('ZADD', seen, now_ms, consumer)
  redis.call('PEXPIRE', queue, ttl)
  redis.call('PEXPIRE', seen, ttl)
  return {0, ahead}
end
redis.call('ZREM', queue, consumer)
redis.call('ZREM', seen, consumer)
redis.call('ZADD', slots, now_ms + tonumber(lease_ms), best .. '|' .. token)
redis.call('PEXPIRE', slots, ttl)
return {1, best}
