-- fly: record items as in flight and move the job's cursor past them, in one step, under the
-- lease (before they are admitted: a runner that dies after admitting them finds them).
-- KEYS (FlyKeys): job (its record's hash), flight (index -> "<task id> <line offset>"), lease.
-- Named args (FlyArgs): token (the caller's lease token), cursor and offset (where feeding goes
--   on: the next item's index and its line's offset); then one FlyItem per item (item_index,
--   entry).
-- Writes the flight entries and the record's cursor and offset.
-- Result: FENCE_HELD (written), FENCE_LOST (the lease is another's or gone: nothing written).
if redis.call('GET', lease) ~= token then return FENCE_LOST end
for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
  redis.call('HSET', flight, ARGV[i + ITEM_INDEX], ARGV[i + ENTRY])
end
redis.call('HSET', job, 'cursor', cursor, 'offset', offset)
return FENCE_HELD
