-- The attempt's final "done" event, the final status, then ack + delete.
-- Plus the job's completion record (schemas/completion_events.py) for the webhook
-- dispatcher, in the same step, so an ended job always has one.
-- KEYS: 1 job stream, 2 job record, 3 reply stream, 4 cancel flag, 5 completion-events stream
-- ARGV: 1 group, 2 entry id, 3 consumer, 4 attempt, 5 ttl (s) after the end, 6 reply maxlen,
--       7 event type, 8 event data, 9.. n record fields as (field, value) pairs,
--       then m completion-record fields as pairs (0: none)
-- Returns 1; 2 when this very finish already happened (a pipeline re-sent after a
-- dropped connection); 0 when refused: the caller lost the entry or the attempt.
if not (owns_entry(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) and owns_attempt(KEYS[2], ARGV[4])) then
  local rec = redis.call("HMGET", KEYS[2], "worker", "attempt", "finished_at")
  if rec[1] == ARGV[3] and rec[2] == ARGV[4] and rec[3] then
    return 2
  end
  return 0
end
local fields, nxt = pairs_at(9)
local completion = pairs_at(nxt)
redis.call("XADD", KEYS[3], "MAXLEN", "~", ARGV[6], "*", "type", ARGV[7], "data", ARGV[8])
redis.call("HSET", KEYS[2], unpack(fields))
redis.call("EXPIRE", KEYS[2], tonumber(ARGV[5]))
redis.call("EXPIRE", KEYS[3], tonumber(ARGV[5]))
redis.call("DEL", KEYS[4])
add_completion(KEYS[5], completion)
redis.call("XACK", KEYS[1], ARGV[1], ARGV[2])
redis.call("XDEL", KEYS[1], ARGV[2])
return 1
