-- beat: a batcher's heartbeat, and what it sees of the others. Its lease is renewed at Redis's
-- own clock (TIME: no two machines' clocks are compared), and every other batcher whose last
-- beat is older than lease_ms is named dead.
-- Silence is not death: every live batcher beats five times a lease, so when no beat at all
-- has come for half a lease, Redis (or its network, or a failover) was what stopped them. The
-- first beat after such a silence opens a grace of one lease, in which nobody is named dead:
-- the others get the time to renew that the outage took from them.
-- KEYS (BeatKeys): registry (the hash of consumer -> its last beat, ms of Redis's clock; and
--   '~heard', the last beat of any batcher, '~grace', until when nobody is named dead).
-- Named args (BeatArgs): consumer, lease_ms.
-- Result: how many batchers hold a live lease (this one included), then the consumers whose
--   lease has run out (their tasks are to be taken over).
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lease = tonumber(lease_ms)
local heard = tonumber(redis.call('HGET', registry, '~heard'))
local grace = tonumber(redis.call('HGET', registry, '~grace'))
if heard and now_ms - heard > lease / 2 then
  grace = now_ms + lease
  redis.call('HSET', registry, '~grace', grace)
end
redis.call('HSET', registry, consumer, now_ms, '~heard', now_ms)
redis.call('PEXPIRE', registry, BATCHERS_TTL_MS)
local dead = {0}
local all = redis.call('HGETALL', registry)
local in_grace = grace and now_ms < grace
for i = 1, #all, 2 do
  local name = all[i]
  if string.sub(name, 1, 1) ~= '~' then
    if now_ms - tonumber(all[i + 1]) <= lease then
      dead[1] = dead[1] + 1
    elseif not in_grace and name ~= consumer then
      dead[#dead + 1] = name
    end
  end
end
return dead
