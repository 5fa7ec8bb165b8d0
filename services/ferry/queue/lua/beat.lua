-- beat: a batcher's heartbeat, and what it sees of the others. Its lease is renewed at Redis's
-- own clock (TIME: no two machines' clocks are compared), and every other batcher whose last
-- beat is older than lease_ms is named dead.
-- KEYS (BeatKeys): registry (the hash of consumer -> its last beat, ms of Redis's clock).
-- Named args (BeatArgs): consumer, lease_ms.
-- Result: the consumers whose lease has run out (their tasks are to be taken over).
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', registry, consumer, now_ms)
redis.call('PEXPIRE', registry, BATCHERS_TTL_MS)
local dead = {}
local all = redis.call('HGETALL', registry)
for i = 1, #all, 2 do
  if all[i] ~= consumer and now_ms - tonumber(all[i + 1]) > tonumber(lease_ms) then
    dead[#dead + 1] = all[i]
  end
end
return dead
