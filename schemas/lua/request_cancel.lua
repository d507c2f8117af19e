-- A client asks to cancel a job: the flag the worker checks once per step. A
-- job that already ended gets no flag (nothing would ever read or clear it).
-- KEYS: 1 job record, 2 cancel flag
-- ARGV: 1 ttl (s) of the flag
-- Returns 1 when the flag was set, 0 when the job had already ended.
local status = redis.call("HGET", KEYS[1], "status")
if status == "done" or status == "error" or status == "cancelled" then
  return 0
end
redis.call("SET", KEYS[2], "1", "EX", tonumber(ARGV[1]))
return 1
