-- budget_pull: a batcher with a batch of a model at Triton takes the other waiters' offers
-- (``budget_ride``) while its call runs, so that its next batch, which leaves on the same slot
-- the moment the call ends (no Redis call then), carries the fleet's oldest work: one queue in
-- front of the instance, and no round trip while the instance waits.
-- KEYS (PullKeys): slots, offers, taken. Named args (PullArgs): consumer, room, lease_ms,
--   model.
-- Result: the riders, ``owner|stream|entry id`` each.
return ride(slots, offers, taken, consumer, tonumber(room), lease_ms, model)
