-- budget_withdraw (a fragment of budget_take and budget_give): a batcher's own offers off the
-- model's set, when it leaves the queue (what it holds goes with its batch, or nowhere).
local function withdraw_offers(set, owner)
  local prefix = owner .. '|'
  for _, member in ipairs(redis.call('ZRANGE', set, 0, -1)) do
    if string.sub(member, 1, #prefix) == prefix then
      redis.call('ZREM', set, member)
    end
  end
end
