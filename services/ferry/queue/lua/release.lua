-- release: put the entries a consumer holds and will not finish back as new ones (delivery
-- count 1), each with its ack and delete in one step, so that another batcher reads them at
-- once; an entry another consumer has taken meanwhile is left to it.
-- KEYS (ReleaseKeys): stream (one partition stream).
-- Named args (ReleaseArgs): group, consumer; then one ReleaseItem per entry (entry_id,
--   envelope: the task, as the entry carried it).
-- Result: how many entries it put back.
local released = 0
for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
  local entry = ARGV[i + ENTRY_ID]
  local row = redis.call('XPENDING', stream, group, entry, entry, 1)
  if row[1] and row[1][2] == consumer then
    append_entry(stream, TASK_FIELD, ARGV[i + ENVELOPE])
    drop_entries(stream, group, {entry}, {entry})
    released = released + 1
  end
end
return released
