-- touch_own: reset the idle time of stream entries the consumer still owns (XCLAIM ... JUSTID,
-- which leaves their delivery counts alone); an entry another consumer has taken is left to it.
-- KEYS (TouchKeys): stream (one partition stream).
-- Named args (TouchArgs): group, consumer; then one TouchItem per entry (entry_id).
-- Result: how many of the entries it touched (the ones the consumer still owned).
local touched = 0
for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
  local entry = ARGV[i + ENTRY_ID]
  local row = redis.call('XPENDING', stream, group, entry, entry, 1)
  if row[1] and row[1][2] == consumer then
    redis.call('XCLAIM', stream, group, consumer, 0, entry, 'JUSTID')
    touched = touched + 1
  end
end
return touched
