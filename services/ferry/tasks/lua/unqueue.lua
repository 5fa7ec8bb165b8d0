-- Local functions that take a task back out of its queue, shared by cancel and withdraw (the
-- loader puts this before each script that declares it, after common).

-- A follower leaves its leader's followers list (``list``), which goes on for the others.
local function unfollow(list, id)
  for _, follower in ipairs(redis.call('LRANGE', list, 0, -1)) do
    if string.sub(follower, 1, #id + 1) == id .. ' ' then redis.call('LREM', list, 1, follower) end
  end
end

-- Whether the task's entry left its stream unread (and its counts the backlog): false if a
-- batcher of ``group`` has read it, or it is not there.
local function unqueue(stream, entry, group, backlog, counted, held)
  if not (entry and stream) then return false end
  local read = redis.pcall('XPENDING', stream, group, entry, entry, 1)
  if read.err then read = {} end  -- no consumer group yet: no batcher has read anything
  if #read > 0 or redis.call('XDEL', stream, entry) ~= 1 then return false end
  leave(backlog, counted)
  leave(backlog, held)
  return true
end
