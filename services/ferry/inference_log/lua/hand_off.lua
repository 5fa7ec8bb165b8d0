-- hand_off: one batch's sampled records of one model, onto the model's log stream while it is
-- below its bound; past the bound a record is dropped and counted, never waited for.
-- KEYS (HandOffKeys): stream (the records the loggers drain), recent (the latest records, for
-- ferry log tail), dropped (a count of the records dropped at the bound), in the model's slot.
-- Named args (HandOffArgs): max_records (the stream's bound), recent_max (the ring's length);
-- then one HandOffItem per record (record: its JSON).
-- Result: {written, dropped}.
local room = tonumber(max_records) - redis.call('XLEN', stream)
local written, lost = 0, 0
for i = FIRST_ITEM, #ARGV, ITEM_SIZE do
  local record = ARGV[i + RECORD]
  if written < room then
    redis.call('XADD', stream, '*', LOG_FIELD, record)
    redis.call('XADD', recent, 'MAXLEN', recent_max, '*', LOG_FIELD, record)
    written = written + 1
  else
    lost = lost + 1
  end
end
if lost > 0 then
  redis.call('INCRBY', dropped, lost)
end
return {written, lost}
