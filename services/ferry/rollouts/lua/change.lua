-- change: store a model's rollout if its generation is still the one the writer read, with the
-- decision in the model's log (two writers never overwrite each other's change unseen).
-- KEYS (ChangeKeys): rollouts (model -> rollout JSON), generations (model -> generation), log
--   (the model's decisions, newest first).
-- Named args (ChangeArgs): model, expected (the generation read; -1: any), rollout (the new
--   JSON), generation (the new one), entry (the log entry, JSON).
-- Writes the rollout and its generation, pushes the entry, trims the log to LOG_LENGTH.
-- Result: CHANGE_STORED, or CHANGE_STALE (another change came first: nothing written).
local current = tonumber(redis.call('HGET', generations, model) or '0')
if tonumber(expected) >= 0 and current ~= tonumber(expected) then return CHANGE_STALE end
redis.call('HSET', rollouts, model, rollout)
redis.call('HSET', generations, model, generation)
redis.call('LPUSH', log, entry)
redis.call('LTRIM', log, 0, LOG_LENGTH - 1)
return CHANGE_STORED
