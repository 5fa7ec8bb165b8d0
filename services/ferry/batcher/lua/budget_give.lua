-- budget_give: a batcher gives its slots of a model's shared budget back (its batches are done
-- at Triton), or leaves the queue (it no longer has work waiting: its offers go too); when
-- batchers wait, the model's name goes out on the budget channel and they ask again at once.
-- KEYS (TakeKeys): slots, queue, seen, offers, taken. Named args (GiveArgs): consumer, model,
--   leave (1: leave the queue too); then the slots given back (``endpoint|token`` each).
-- Result: how many waiters were told.
for i = FIRST_ITEM, #ARGV do
  redis.call('ZREM', slots, ARGV[i + SLOT])
end
if tonumber(leave) == 1 then
  redis.call('ZREM', queue, consumer)
  redis.call('ZREM', seen, consumer)
  redis.call('HDEL', taken, consumer)  -- it holds none of the model's work: nothing to drop
  withdraw_offers(offers, consumer)
end
if #ARGV >= FIRST_ITEM and redis.call('ZCARD', queue) > 0 then
  redis.call('PUBLISH', BUDGET_CHANNEL, model)
  return 1
end
return 0
