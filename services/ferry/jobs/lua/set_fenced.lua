-- set_fenced: set fields of a job's record, only while the caller holds the job's lease.
-- KEYS (SetFencedKeys): job (its record's hash), lease (its lease key).
-- Named args (SetFencedArgs): token (the caller's lease token); then one Field per field to set
--   (field, value).
-- Writes the record's fields.
-- Result: FENCE_HELD (written), FENCE_LOST (the lease is another's or gone: nothing written).
if redis.call('GET', lease) ~= token then return FENCE_LOST end
for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
  redis.call('HSET', job, ARGV[i + FIELD], ARGV[i + VALUE])
end
return FENCE_HELD
