-- gcra: check and count one request of a client against its rate (the generic cell rate
-- algorithm), by Redis's clock (TIME), in ms.
-- KEYS (GcraKeys): tat (the client's theoretical arrival time: ``keys.rate_key``).
-- Named args (GcraArgs): interval_ms (60 000 / the rate a minute), burst (requests at once).
-- Writes the moved-on arrival time when allowed, expiring when the whole allowance is back.
-- Result: {GCRA_ALLOWED, requests remaining, ms until the whole allowance is back} or
--   {GCRA_LIMITED, ms until one is allowed, ms until the whole allowance is back}; the ms as
--   strings (fractions kept).
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + tonumber(now[2]) / 1000
local interval, cells = tonumber(interval_ms), tonumber(burst)
local at = tonumber(redis.call('GET', tat)) or now
if at < now then at = now end
local next_at = at + interval
local allowed_at = next_at - cells * interval
if allowed_at > now then
  return {GCRA_LIMITED, tostring(allowed_at - now), tostring(at - now)}
end
redis.call('SET', tat, tostring(next_at), 'PX', math.ceil(next_at - now) + 1)
return {GCRA_ALLOWED, math.floor((now - allowed_at) / interval), tostring(next_at - now)}
