-- lease: take a job's lease, or keep it (its expiry moved on), for the caller's token.
-- KEYS (LeaseKeys): job (its record's hash: the job must exist), lease.
-- Named args (LeaseArgs): token (the caller's lease token), ms (how long the lease lasts).
-- Writes the lease key, with its expiry.
-- Result: FENCE_HELD (the token holds it now), FENCE_LOST (another runner holds it, or there
--   is no such job: nothing written).
local holder = redis.call('GET', lease)
if holder and holder ~= token then return FENCE_LOST end
if redis.call('EXISTS', job) == 0 then return FENCE_LOST end
redis.call('SET', lease, token, 'PX', ms)
return FENCE_HELD
