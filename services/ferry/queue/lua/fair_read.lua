-- fair_read: a batcher's read of one partition's stream of one priority while its fair queue
-- holds tasks: what the stream holds unread first (admitted before the contention, oldest
-- first), then, for the rest of ``want``, the fair queue's tasks in the order of their start
-- tags (tasks/lua/admit.lua tags them), each moved to the stream and read at once, so that it
-- is pending for this consumer (at-least-once) like any entry read.
-- KEYS (FairReadKeys): stream, fair_queue, fair_state.
-- Named args (FairReadArgs): group, consumer, want, task_prefix (its partition's task keys).
-- A task whose record is gone, or no longer PENDING, leaves the fair queue unread.
-- Result: {entries (as XREADGROUP's for the stream: {id, {field, value, ...}} each), the tasks
--   still waiting in the fair queue}.
want = tonumber(want)
local entries = {}

local function read(n)
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS', stream,
                           '>')
  if reply then
    for _, entry in ipairs(reply[1][2]) do entries[#entries + 1] = entry end
  end
end

read(want)
local short = want - #entries
local popped_any = {}
if short > 0 then
  local popped = redis.call('ZPOPMIN', fair_queue, short)
  popped_any = popped
  local moved = 0
  for i = 1, #popped, 2 do
    local key = task_prefix .. popped[i]
    local task = redis.call('HMGET', key, 'envelope', 'flow', 'status')
    if task[2] then leave_flow(fair_state, task[2]) end
    if task[1] and task[3] == PENDING then
      local entry = append_entry(stream, TASK_FIELD, task[1])
      redis.call('HSET', key, 'entry', entry, 'stream', stream)
      redis.call('HDEL', key, 'envelope', 'fair', 'fairstate', 'flow')
      moved = moved + 1
    end
    redis.call('HSET', fair_state, 'v', popped[i + 1])
  end
  if moved > 0 then read(moved) end
end
local left = redis.call('ZCARD', fair_queue)
if left == 0 and #popped_any > 0 then  -- nobody waits: no flow's count or weight is left over
  for _, field in ipairs(redis.call('HKEYS', fair_state)) do
    local kind = string.sub(field, 1, 2)
    if kind == 'n|' or kind == 'w|' then redis.call('HDEL', fair_state, field) end
  end
  redis.call('HSET', fair_state, 'w', '0')
end
return {entries, left}
