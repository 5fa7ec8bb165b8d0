-- heal: reset a partition's backlog counts when it has no unfinished task.
-- KEYS: backlog (the partition's backlog hash), then each of its streams (from FIRST_STREAM).
-- Result: 1 when the counts were reset (some were left by a lost write), else 0.
local entries = 0
for i = FIRST_STREAM, #KEYS do
  entries = entries + redis.call('XLEN', KEYS[i])
end
if entries == 0 then
  return redis.call('DEL', backlog)
end
return 0
