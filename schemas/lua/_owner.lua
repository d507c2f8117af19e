-- Prelude of every fenced script (BullMQ's lock-token idea, with the consumer
-- group's pending-entries list as the lock): the caller owns a job entry only
-- while the PEL names it as the entry's consumer, and owns an attempt only
-- while the job record's attempt counter still equals it. A worker that lost
-- its lease fails one or both checks, so it can never ack, finish, dead-letter
-- or publish a final event for the live attempt.
local function owner_of(stream, group, entry)
  local row = redis.call("XPENDING", stream, group, entry, entry, 1)
  if row[1] == nil then
    return nil
  end
  return row[1][2]
end

local function owns_entry(stream, group, entry, consumer)
  return owner_of(stream, group, entry) == consumer
end

local function owns_attempt(info, attempt)
  return tonumber(redis.call("HGET", info, "attempt") or "-1") == tonumber(attempt)
end

-- ARGV[from] = n, then n (field, value) pairs: returns the flat list and the index after it.
-- A missing count is 0 (a trailing group the caller left out).
local function pairs_at(from)
  local n = tonumber(ARGV[from]) or 0
  local out = {}
  for i = 1, 2 * n do
    out[i] = ARGV[from + i]
  end
  return out, from + 2 * n + 1
end

-- The completion record of an ended job: written only while the stream exists
-- (a webhook dispatcher's consumer group creates it), so nothing piles up where
-- no dispatcher runs; never trimmed: the dispatcher deletes what it has handled.
local function add_completion(stream, record)
  if #record > 0 and redis.call("EXISTS", stream) == 1 then
    redis.call("XADD", stream, "*", unpack(record))
  end
end
