-- heal: reset a partition's backlog counts when it has no unfinished task.
-- KEYS: backlog (the partition's backlog hash), then each of its streams and fair queues (from
--   FIRST_STREAM; an empty fair queue does not exist).
-- Result: 1 when the counts were reset (some were left by a lost write), else 0.
local entries = 0
for i = FIRST_STREAM, #KEYS do
  if redis.call('TYPE', KEYS[i]).ok == 'stream' then
    entries = entries + redis.call('XLEN', KEYS[i])
  else
    entries = entries + redis.call('EXISTS', KEYS[i])
  end
end
if entries == 0 then
  return redis.call('DEL', backlog)
end
return 0
