-- A worker starts an attempt of a job entry it holds.
-- KEYS: 1 job stream, 2 job record, 3 cancel flag
-- ARGV: 1 group, 2 entry id, 3 consumer, 4 ttl (s) of the record while the job runs
-- Returns {attempt, cancelled (0/1)}, or {-1, 0} when the entry is not this consumer's.
if not owns_entry(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then
  return {-1, 0}
end
local attempt = redis.call("HINCRBY", KEYS[2], "attempt", 1)
redis.call("EXPIRE", KEYS[2], tonumber(ARGV[4]))
return {attempt, redis.call("EXISTS", KEYS[3])}
