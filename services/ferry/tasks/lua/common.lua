-- Local functions shared by the task scripts; the loader puts this before each script that
-- declares it (ScriptSpec.fragments), after the generated prologue, and writes its constants in.

-- One task's end, added to ``frames`` under the announcement tag of the process that made its id
-- (its last digits: keys.announce_tag): "<id> <status> <n> <body>", with n = 0 and no body when
-- the body is over ``inline`` bytes (whoever waits reads it). The one writer of the frame;
-- ferry.tasks.record.announcements is its one reader.
local function announce(frames, id, status, body, inline)
  local tag = string.sub(id, -ANNOUNCE_TAG_LENGTH)
  local list = frames[tag]
  if not list then
    list = {}
    frames[tag] = list
  end
  if #body <= inline then
    list[#list + 1] = id .. ' ' .. status .. ' ' .. #body .. ' ' .. body
  else
    list[#list + 1] = id .. ' ' .. status .. ' 0 '
  end
end

-- Every tag's frames in one message on its process's channel (keys.done_channel); on a Redis
-- Cluster (``shard``: the partition's hash tag) on that channel's copy in the partition's own
-- slot, heard on this node (keys.done_shard_channel), not over the cluster bus. A Redis before
-- 7.0 has no SPUBLISH: the plain channel then (this script has written already, and must end).
local function publish_frames(frames, shard)
  for tag, list in pairs(frames) do
    local message = table.concat(list)
    if shard == '' or type(redis.pcall('SPUBLISH', DONE_CHANNEL_PREFIX .. tag .. shard,
                                       message)) == 'table' then
      redis.call('PUBLISH', DONE_CHANNEL_PREFIX .. tag, message)
    end
  end
end

-- A task that ended with a callback URL (false or '' none): its webhook, for a batcher to send.
local function queue_webhook(webhooks, id, url)
  if url and url ~= '' then
    redis.call('XADD', webhooks, 'MAXLEN', '~', WEBHOOK_MAXLEN, '*', 'task_id', id, 'url', url)
  end
end

-- One unfinished task fewer under a backlog hash's field (false or '' none): a count lost to a
-- failed write is never taken below none.
local function leave(backlog, field)
  if field and field ~= '' and redis.call('HINCRBY', backlog, field, -1) < 0 then
    redis.call('HSET', backlog, field, 0)
  end
end
