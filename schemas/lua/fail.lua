-- A job that cannot be served: its "error" event and status (when its id is
-- known), a copy on the dead-letter stream (capped), then ack + delete.
-- Plus, when the job is known, its completion record (schemas/completion_events.py)
-- for the webhook dispatcher, in the same step.
-- KEYS: 1 job stream, 2 job record, 3 reply stream, 4 cancel flag, 5 dead-letter stream,
--       6 completion-events stream
-- ARGV: 1 group, 2 entry id, 3 consumer, 4 attempt the caller holds ("0": none yet,
--       e.g. an unreadable payload: only the entry is checked), 5 ttl (s) after the end,
--       6 reply maxlen, 7 error event data ("": the job id is unknown, so no event
--       and no status), 8 dead-letter maxlen,
--       9.. n record fields as pairs, then m dead-letter fields as pairs, then
--       k completion-record fields as pairs (0: none)
-- Returns 1; 2 when this very failure already happened (re-sent pipeline); 0 when refused.
local fenced = tonumber(ARGV[4]) > 0
if not (owns_entry(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) and ((not fenced) or owns_attempt(KEYS[2], ARGV[4]))) then
  if fenced then
    local rec = redis.call("HMGET", KEYS[2], "worker", "attempt", "finished_at")
    if rec[1] == ARGV[3] and rec[2] == ARGV[4] and rec[3] then
      return 2
    end
  end
  return 0
end
local fields, nxt = pairs_at(9)
local dead, after = pairs_at(nxt)
local completion = pairs_at(after)
if ARGV[7] ~= "" then
  redis.call("XADD", KEYS[3], "MAXLEN", "~", ARGV[6], "*", "type", "error", "data", ARGV[7])
  redis.call("HSET", KEYS[2], unpack(fields))
  redis.call("EXPIRE", KEYS[2], tonumber(ARGV[5]))
  redis.call("EXPIRE", KEYS[3], tonumber(ARGV[5]))
  redis.call("DEL", KEYS[4])
  add_completion(KEYS[6], completion)
end
-- Exact cap: dead letters are rare, and "~" would not trim a small stream at all.
redis.call("XADD", KEYS[5], "MAXLEN", ARGV[8], "*", unpack(dead))
redis.call("XACK", KEYS[1], ARGV[1], ARGV[2])
redis.call("XDEL", KEYS[1], ARGV[2])
return 1
