-- budget_ride (a fragment of budget_take and budget_pull): the first ``want`` of the other
-- batchers' offers of a model (``offers_key``, in the set's order: high priority, then oldest),
-- taken off the set for ``taker`` to carry as riders; each owner finds what went in
-- ``taken_key`` (and the budget channel tells it at once). Offers of batchers with a batch of
-- the model at Triton are left (a slot's token begins with its holder's name): their work
-- waits for their own call, as a server's queue waits for its own instance. An offer of a
-- batcher that died rides too: the move takes only entries their owner still holds
-- (``take_riders``), so its tasks are rescued at once.
local function ride(slots_key, offers_key, taken_key, taker, want, lease, channel_model)
  local riders, told, owners = {}, {}, 0
  if want <= 0 then
    return riders
  end
  local busy = {[taker] = true}
  for _, slot in ipairs(redis.call('ZRANGE', slots_key, 0, -1)) do
    local holder = string.match(slot, '|([^|]*)%.[^.|]*$')
    if holder then
      busy[holder] = true
    end
  end
  for _, member in ipairs(redis.call('ZRANGE', offers_key, 0, -1)) do
    local owner, rest = string.match(member, '^([^|]*)|(.*)$')
    if not busy[owner] then
      redis.call('ZREM', offers_key, member)
      riders[#riders + 1] = member
      if not told[owner] then
        owners = owners + 1
      end
      told[owner] = (told[owner] or '') .. rest .. '\n'
      if #riders >= want then
        break
      end
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
