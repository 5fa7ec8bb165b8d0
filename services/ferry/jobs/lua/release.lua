-- release: give a job's lease up, if the caller's token holds it.
-- KEYS (ReleaseKeys): lease.
-- Named args (ReleaseArgs): token (the caller's lease token).
-- Deletes the lease key when the token holds it.
-- Result: FENCE_HELD (it held it, and gave it up), FENCE_LOST (another's or none: left alone).
if redis.call('GET', lease) ~= token then return FENCE_LOST end
redis.call('DEL', lease)
return FENCE_HELD
