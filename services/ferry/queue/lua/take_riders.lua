-- take_riders: move entries another batcher offered to its model's shared budget
-- (``batcher.budget``) to this consumer, with their payloads, so that they ride its batch. Only
-- an entry its owner still holds moves (one it settled, or one a rescue gave to a third, stays
-- where it is); its delivery count is kept (RETRYCOUNT): riding is not a failed delivery.
-- KEYS (RiderKeys): stream (one partition stream).
-- Named args (RiderArgs): group, consumer; then one RiderItem per entry (entry_id, owner).
-- Result: {entry id, fields, deliveries} per entry moved.
local moved = {}
for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
  local entry = ARGV[i + ENTRY_ID]
  local row = redis.call('XPENDING', stream, group, entry, entry, 1)
  if row[1] and row[1][2] == ARGV[i + OWNER] then
    local count = row[1][4]
    local claimed = redis.call('XCLAIM', stream, group, consumer, 0, entry, 'RETRYCOUNT', count)
    if claimed[1] and claimed[1][2] then
      moved[#moved + 1] = {claimed[1][1], claimed[1][2], count}
    end
  end
end
return moved
