-- budget_told (a fragment of budget_take and budget_offer): what other batchers took of
-- ``owner``'s offers since it last asked ("stream|entry id" each, from ``taken_key``, where
-- ``budget_ride`` writes them), forgotten once told.
local function taken_from(taken_key, owner)
  local found = redis.call('HGET', taken_key, owner)
  if not found then
    return {}
  end
  redis.call('HDEL', taken_key, owner)
  local gone = {}
  for member in string.gmatch(found, '[^\n]+') do
    gone[#gone + 1] = member
  end
  return gone
end
