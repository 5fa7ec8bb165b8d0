-- forget: for a retry, make ended items unended, under the lease: their done bits cleared and
-- uncounted, the cursor rewound to the start and the retry flag cleared, in one step.
-- KEYS (ForgetKeys): job (its record's hash), done (a bit per item), lease.
-- Named args (ForgetArgs): token (the caller's lease token), count_field (the count the items
--   ended in, all of them the same); then one ForgetItem per item (item_index).
-- Result: FENCE_HELD (written), FENCE_LOST (the lease is another's or gone: nothing written).
if redis.call('GET', lease) ~= token then return FENCE_LOST end
for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
  redis.call('SETBIT', done, ARGV[i + ITEM_INDEX], 0)
end
redis.call('HINCRBY', job, count_field, (FIRST_ITEM - 1 - #ARGV) / ITEM_SIZE)
redis.call('HSET', job, 'cursor', 0, 'offset', 0, 'retry', '')
return FENCE_HELD
