-- idempotency_swap: replace the value of an idempotency key, or delete the key, only if it
-- still holds what the caller expects (its own request's, or one whose task never came to be).
-- KEYS (SwapKeys): key (the client's idempotency key).
-- Named args (SwapArgs): expected (the value it must hold), replacement (the value to set, its
--   TTL kept; '' : delete the key).
-- Result: SWAP_DONE (replaced or deleted), SWAP_NOT_HELD (it held something else, or nothing:
--   left alone).
if redis.call('GET', key) ~= expected then return SWAP_NOT_HELD end
if replacement == '' then
  redis.call('DEL', key)
else
  redis.call('SET', key, replacement, 'KEEPTTL')
end
return SWAP_DONE
