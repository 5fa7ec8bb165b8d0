-- budget_pull: a batcher with a batch of a model at Triton takes the other waiters' offers
-- (``budget_ride``) while its call runs, so that its next batch, which leaves on the same slot
-- the moment the call ends (no Redis call then), carries the fleet's oldest work: one queue in
-- front of the instance, and no round trip while the instance waits. Its next batch carries
-- ``batch`` tasks at most; the offers ride in front of its own boarded tasks that came later.
-- KEYS (PullKeys): slots, offers, taken. Named args (PullArgs): consumer, batch, lease_ms,
--   model; then items (PullItem: place): the places of its own boarded tasks, in order (the
--   first ``batch`` of them; none: the batch's room is ``batch``).
-- Result: the riders, ``owner|stream|entry id`` each.
local own = {}
for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
  own[#own + 1] = tonumber(ARGV[i + PLACE])
end
return ride(slots, offers, taken, consumer, tonumber(batch), lease_ms, model, own)
