-- budget_offer: a batcher offers tasks it holds for a model to the shared budget's one queue,
-- whether or not it waits for a slot itself (``budget_take`` says how the next slot's batch
-- takes them as riders), and learns which of its earlier offers others took.
-- KEYS (OfferKeys): offers, taken. Named args (OfferArgs): consumer,
--   lease_ms; then its offers (OfferItem: "stream|entry id", place in the set).
-- Result: the offers of its that others took since it last asked ("stream|entry id" each).
local gone = taken_from(taken, consumer)
if #ARGV >= FIRST_ITEM then
  for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
    redis.call('ZADD', offers, tonumber(ARGV[i + PLACE]), consumer .. '|' .. ARGV[i + MEMBER])
  end
  redis.call('PEXPIRE', offers, tonumber(lease_ms) * 10)
end
return gone
