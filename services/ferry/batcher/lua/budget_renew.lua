-- budget_renew: a batcher's slots of a model live one more lease (its calls are still at
-- Triton). A slot that lapsed meanwhile is not taken again: the call goes on, over budget for
-- its remainder, and the batcher counts it (the answer).
-- KEYS (RenewKeys): slots. Named args (RenewArgs): lease_ms; then the slots.
-- Result: how many of them were still held.
local now = redis.call('TIME')
local until_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(lease_ms)
local held = 0
for i = FIRST_ITEM, #ARGV do
  if redis.call('ZSCORE', slots, ARGV[i + SLOT]) then
    redis.call('ZADD', slots, 'XX', until_ms, ARGV[i + SLOT])
    held = held + 1
  end
end
redis.call('PEXPIRE', slots, tonumber(lease_ms) * 10)
return held
