-- budget_take: a slot of a model's shared in-flight budget for one batcher, or its place in the
-- queue of batchers waiting for one. A slot is one batch at one Triton server; each server
-- takes as many of the model's batches as it runs instances (the caller's ``limits``, read
-- from the servers' configurations). Slots lapse ``lease_ms`` after they were taken or last
-- renewed (a batcher that died frees its slots within a lease); waiters that have not asked
-- for ``patience_ms`` leave the queue (a waiter asks again at least that often).
-- Waiting is first come, first served: a batcher gets a slot only when fewer batchers wait
-- ahead of it than there are free slots, so a freed slot goes to whoever waited longest.
-- One queue: every batcher offers the tasks it holds for the model (``offers``: a sorted set
-- of ``owner|stream|entry id``, high priority first, then oldest first; here while it waits,
-- ``budget_offer`` otherwise), and the batcher that takes a slot takes up to ``room`` of the
-- others' offers with it, as riders: its batch holds everything that boarded anywhere in the
-- fleet meanwhile, the batch one queue in front of the pool would make. A rider's owner finds
-- it in ``taken`` at its next call (the budget channel tells it to call now): it no longer
-- holds it. An offer is taken by one batcher at most, and never once its owner has a slot (a
-- grant takes the grantee's own offers off, and tells it what others took, in one step).
-- A batcher whose batch is done and that waits for the model's next slot gives its slot back
-- in the same call, and takes it again at once, ahead of the queue (no message, no second
-- round trip, while its batch's results are still being written): the batch it sends takes
-- the other waiters' oldest offers along, so no task waits longer for it.
-- Riders: ``budget_ride``.
-- KEYS (TakeKeys): slots, queue, seen, offers, taken. Named args (TakeArgs): consumer, token,
--   lease_ms, patience_ms, room, model; then items (TakeItem: kind, name, value): a server
--   ('s', endpoint, its instances), an offer of this batcher ('o', stream|entry id, score) or
--   a slot it gives back ('g', endpoint|token, 0).
-- Result: {1, endpoint, taken from it, riders} (taken: the slot is ``endpoint|token``; riders:
--   ``owner|stream|entry id`` each) or {0, waiting ahead, taken from it}.
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
local function room_left()
  local used = {}
  for _, slot in ipairs(redis.call('ZRANGE', slots, 0, -1)) do
    local endpoint = string.match(slot, '^(.*)|[^|]*$')
    used[endpoint] = (used[endpoint] or 0) + 1
  end
  local free, best, best_room = 0, nil, 0
  for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
    if ARGV[i + KIND] == 's' then
      local endpoint, limit = ARGV[i + NAME], tonumber(ARGV[i + VALUE])
      local left = limit - (used[endpoint] or 0)
      if left > 0 then
        free = free + left
        if left > best_room then
          best, best_room = endpoint, left
        end
      end
    end
  end
  return free, best
end

-- The slots this batcher gives back (its batches are done); whether it gave any.
local function give_back()
  local gave = false
  for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
    if ARGV[i + KIND] == 'g' then
      redis.call('ZREM', slots, ARGV[i + NAME])
      gave = true
    end
  end
  return gave
end

-- It waits: in the queue (first come, first served), its offers in the set.
local function wait_in_queue(now_us, now_ms, ttl)
  redis.call('ZADD', queue, 'NX', now_us, consumer)
  redis.call('ZADD', seen, now_ms, consumer)
  redis.call('PEXPIRE', queue, ttl)
  redis.call('PEXPIRE', seen, ttl)
  local offered = false
  for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
    if ARGV[i + KIND] == 'o' then
      redis.call('ZADD', offers, tonumber(ARGV[i + VALUE]), consumer .. '|' .. ARGV[i + NAME])
      offered = true
    end
  end
  if offered then
    redis.call('PEXPIRE', offers, ttl)
  end
end

local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])  -- the queue's order: no two
local now_ms = math.floor(now_us / 1000)  -- scripts run in one microsecond
local ttl = tonumber(lease_ms) * 10
prune(now_ms)
local gave = give_back()
local gone = taken_from(taken, consumer)
local free, best = room_left()
local ahead = redis.call('ZRANK', queue, consumer)
if gave then  -- its batch is done and it waits: the slot goes on with it at once (its batch
  ahead = 0   -- takes the others' oldest offers as riders: no task waits longer for this)
elseif ahead == false then
  ahead = redis.call('ZCARD', queue)
end
if best == nil or ahead >= free then
  wait_in_queue(now_us, now_ms, ttl)
  if gave then  -- no room for it after all (a server left): the waiters may find some
    redis.call('PUBLISH', BUDGET_CHANNEL, model)
  end
  return {0, ahead, gone}
end
redis.call('ZREM', queue, consumer)
redis.call('ZREM', seen, consumer)
withdraw_offers(offers, consumer)
redis.call('ZADD', slots, now_ms + tonumber(lease_ms), best .. '|' .. token)
redis.call('PEXPIRE', slots, ttl)
if gave and free > 1 and redis.call('ZCARD', queue) > 0 then  -- room for others too
  redis.call('PUBLISH', BUDGET_CHANNEL, model)
end
return {1, best, gone, ride(slots, offers, taken, consumer, tonumber(room), lease_ms, model)}
