-- The attempt's first events (restarted, started) and the "running" status.
-- KEYS: 1 job stream, 2 job record, 3 reply stream
-- ARGV: 1 group, 2 entry id, 3 consumer, 4 attempt, 5 ttl (s) while running, 6 reply maxlen,
--       7.. n events as (type, data) pairs, then n record fields as (field, value) pairs
-- Returns 1, or 0 when the caller no longer owns the entry and the attempt.
if not (owns_entry(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) and owns_attempt(KEYS[2], ARGV[4])) then
  return 0
end
local events, nxt = pairs_at(7)
local fields = pairs_at(nxt)
for i = 1, #events, 2 do
  redis.call("XADD", KEYS[3], "MAXLEN", "~", ARGV[6], "*", "type", events[i], "data", events[i + 1])
end
redis.call("HSET", KEYS[2], unpack(fields))
redis.call("EXPIRE", KEYS[2], tonumber(ARGV[5]))
redis.call("EXPIRE", KEYS[3], tonumber(ARGV[5]))
return 1
