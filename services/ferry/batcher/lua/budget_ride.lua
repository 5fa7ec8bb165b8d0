-- budget_ride (a fragment of budget_take and budget_pull): the other batchers' offers of a model
-- (``offers_key``, in the set's order: high priority, then oldest) that the taker's next batch
-- carries, taken off the set for ``taker`` to carry as riders; each owner finds what went in
-- ``taken_key`` (and the budget channel tells it at once). The batch carries ``want`` tasks at
-- most, in one order over the taker's own and the offers: ``own`` holds the places of the
-- taker's own boarded tasks, in order (empty: ``want`` is its room, and riders fill it), and an
-- offer rides only while fewer than ``want`` tasks, its own or riders, come before it. So a
-- waiter's task older than what the taker holds rides its next batch, however much the taker
-- holds, and one queue stays first come, first served: a batcher that keeps its slot under
-- load does not keep the others' older work waiting. Offers of batchers with a batch of the
-- model at Triton are left (a slot's token begins with its holder's name): their work waits
-- for their own call, as a server's queue waits for its own instance. An offer of a batcher
-- that died rides too: the move takes only entries their owner still holds (``take_riders``),
-- so its tasks are rescued at once.
-- The taker and the batchers holding a slot of the model: their offers do not ride.
local function busy_with(slots_key, taker)
  local busy = {[taker] = true}
  for _, slot in ipairs(redis.call('ZRANGE', slots_key, 0, -1)) do
    local holder = string.match(slot, '|([^|]*)%.[^.|]*$')
    if holder then
      busy[holder] = true
    end
  end
  return busy
end

local function ride(slots_key, offers_key, taken_key, taker, want, lease, channel_model, own)
  own = own or {}
  local riders, told, owners = {}, {}, 0
  if want <= 0 then
    return riders
  end
  local busy = busy_with(slots_key, taker)
  local offered = redis.call('ZRANGE', offers_key, 0, -1, 'WITHSCORES')
  local before = 0  -- the taker's own tasks that come before the offer at hand
  for i = 1, #offered, 2 do
    local member, place = offered[i], tonumber(offered[i + 1])
    while before < #own and own[before + 1] <= place do
      before = before + 1
    end
    if before + #riders >= want then
      break
    end
    local owner, rest = string.match(member, '^([^|]*)|(.*)$')
    if not busy[owner] then
      redis.call('ZREM', offers_key, member)
      riders[#riders + 1] = member
      if not told[owner] then
        owners = owners + 1
      end
      told[owner] = (told[owner] or '') .. rest .. '\n'
    end
  end
  for owner, list in pairs(told) do
    redis.call('HSET', taken_key, owner, (redis.call('HGET', taken_key, owner) or '') .. list)
  end
  if owners > 0 then
    redis.call('PEXPIRE', taken_key, tonumber(lease) * 10)
    redis.call('PUBLISH', BUDGET_CHANNEL, channel_model)  -- the owners learn it at once
  end
  return riders
end
