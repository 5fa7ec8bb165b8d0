-- A local function shared by the steps that take a task out of a fair queue: the batchers'
-- fair read (queue/lua/fair_read.lua) and cancel and withdraw (unqueue); admit.lua is the step
-- that puts one in. The loader puts this before each script that declares it.

-- A flow's task leaves its fair queue (``state``: the queue's hash): the flow's count of
-- waiting tasks, and once it has none waiting, its weight from the waiting flows' ('w').
local function leave_flow(state, flow)
  if redis.call('HINCRBY', state, 'n|' .. flow, -1) <= 0 then
    local weight = redis.call('HGET', state, 'w|' .. flow) or '0'
    redis.call('HDEL', state, 'n|' .. flow, 'w|' .. flow)
    redis.call('HINCRBYFLOAT', state, 'w', '-' .. weight)
  end
end
