-- commit: commit a written result segment and the items it holds, once each, under the lease.
-- KEYS (CommitKeys): job (its record's hash), done (a bit per item), flight (the items in
--   flight), segments (the names of its result segments), lease.
-- Named args (CommitArgs): token (the caller's lease token), segment (its name, '' none); then
--   one CommitItem per item it holds (item_index, count_field: the record's count it ends in).
-- Appends the segment; sets each item's done bit, counting it in its count field only the first
-- time; takes it out of flight.
-- Result: FENCE_HELD (committed), FENCE_LOST (the lease is another's or gone: nothing written).
if redis.call('GET', lease) ~= token then return FENCE_LOST end
if segment ~= '' then redis.call('RPUSH', segments, segment) end
for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
  if redis.call('SETBIT', done, ARGV[i + ITEM_INDEX], 1) == 0 then
    redis.call('HINCRBY', job, ARGV[i + COUNT_FIELD], 1)
  end
  redis.call('HDEL', flight, ARGV[i + ITEM_INDEX])
end
return FENCE_HELD
