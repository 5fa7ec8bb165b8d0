-- Local functions that write a partition stream's entries: the queue's room owns the stream's
-- life, and every script that must change an entry in the same step as its own keys (admission,
-- completion, cancel, expiry, withdrawal; the fair read, the hand-back) does it through these.
-- The loader puts this before each script that declares it. (A webhook stream and the dead
-- letters are not partition streams: their scripts write them.)

-- An entry appended to ``stream`` with one field (a task's envelope, a doorbell): its id.
local function append_entry(stream, field, value)
  return redis.call('XADD', stream, '*', field, value)
end

-- An entry acknowledged by ``group``: 1 if the group held it (this is its first ack), else 0.
local function ack_entry(stream, group, entry)
  return redis.call('XACK', stream, group, entry)
end

-- Entries a group has finished with: ``acks`` (maybe none) acknowledged, and all of ``ids``
-- deleted, so that the stream holds only work not finished.
local function drop_entries(stream, group, acks, ids)
  if #acks > 0 then redis.call('XACK', stream, group, unpack(acks)) end
  redis.call('XDEL', stream, unpack(ids))
end

-- An entry taken out of ``stream`` unread: false if a batcher of ``group`` has read it (or it
-- is gone). A stream without the group yet: nobody has read anything.
local function take_unread(stream, group, entry)
  local read = redis.pcall('XPENDING', stream, group, entry, entry, 1)
  if read.err then read = {} end
  return #read == 0 and redis.call('XDEL', stream, entry) == 1
end
