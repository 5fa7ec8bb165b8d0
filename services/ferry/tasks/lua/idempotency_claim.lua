-- idempotency_claim: take an idempotency key for a request, unless a request took it before.
-- KEYS (ClaimKeys): key (the client's idempotency key: ``idempotency.redis_key``).
-- Named args (ClaimArgs): holder ("<task id> <digest>": this request's), ttl (seconds).
-- Writes the key (with its TTL) when it is free.
-- Result: the value already there ("<task id> <digest>[ +]": the request that holds it), or nil
--   when this request took it.
local current = redis.call('GET', key)
if current then return current end
redis.call('SET', key, holder, 'EX', ttl)
return false
