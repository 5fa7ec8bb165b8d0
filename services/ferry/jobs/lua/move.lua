-- move: put a job in a new state if it is in one of the states it may leave for it.
-- KEYS (MoveKeys): job (its record's hash).
-- Named args (MoveArgs): from_states (space-separated), to_state, stamp_field (the record's
--   field stamped on entering it) and stamp; then one Field per field to set with it (field,
--   value).
-- Writes the state, its stamp and the fields, and clears the job's note ('why it is not
-- moving'); only from one of ``from_states``.
-- Result: the job's state before, whether it moved or not (nil: no such job).
local status = redis.call('HGET', job, 'status')
if not status then return nil end
for state in string.gmatch(from_states, '%S+') do
  if state == status then
    redis.call('HSET', job, 'status', to_state, stamp_field, stamp)
    redis.call('HDEL', job, 'note')
    for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
      redis.call('HSET', job, ARGV[i + FIELD], ARGV[i + VALUE])
    end
    return status
  end
end
return status
