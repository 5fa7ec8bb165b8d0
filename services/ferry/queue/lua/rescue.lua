-- rescue: take over up to limit entries a dead consumer holds in one stream, for this one, in
-- one step: two rescuers never share an entry (the second finds it owned by the first), and an
-- entry the dead one acknowledged meanwhile is not taken.
-- KEYS (RescueKeys): stream (one partition stream).
-- Named args (RescueArgs): group, dead, consumer, limit.
-- Result: {entries, deliveries, left}: the entries taken (XCLAIM's reply, id and fields; an
-- entry deleted since is dropped from the pending list, as XCLAIM does, and not returned),
-- each one's delivery count with this one, and whether the dead consumer still holds entries
-- here. One that holds none here any more is removed from the group here (in this same step:
-- never while it holds an entry, which would drop the entry from the pending list).
local rows = redis.call('XPENDING', stream, group, '-', '+', tonumber(limit), dead)
if #rows == 0 then
  redis.call('XGROUP', 'DELCONSUMER', stream, group, dead)
  return {{}, {}, 0}
end
local ids, count_of = {}, {}
for i, row in ipairs(rows) do
  ids[i] = row[1]
  count_of[row[1]] = row[4] + 1
end
local entries, deliveries = {}, {}
for _, entry in ipairs(redis.call('XCLAIM', stream, group, consumer, 0, unpack(ids))) do
  if type(entry) == 'table' then  -- (a Redis before 7 answers nil for a deleted entry)
    entries[#entries + 1] = entry
    deliveries[#deliveries + 1] = count_of[entry[1]] or 1
  end
end
local left = redis.call('XPENDING', stream, group, '-', '+', 1, dead)
if #left == 0 then
  redis.call('XGROUP', 'DELCONSUMER', stream, group, dead)
end
return {entries, deliveries, #left}
