-- The result of one delivery attempt.
-- KEYS: 1 outbox, 2 the delivery's hash, 3 recent-attempts list, 4 dead-letter list
-- ARGV: 1 delivery id, 2 outcome: "delivered" | "retry" | "dead", 3 when a retry is due (unix s),
--       4 attempts made, 5 last error, 6 line for the recent list (JSON), 7 its cap,
--       8 line for the dead-letter list (JSON, outcome "dead"), 9 its cap
-- Returns 1, or 0 when the delivery was settled already (another dispatcher took
-- it over after this one's lease passed): nothing is written twice or revived.
if redis.call("EXISTS", KEYS[2]) == 0 then
  return 0
end
if ARGV[2] == "retry" then
  redis.call("HSET", KEYS[2], "attempts", ARGV[4], "last_error", ARGV[5])
  redis.call("ZADD", KEYS[1], "XX", ARGV[3], ARGV[1])
else
  if ARGV[2] == "dead" then
    redis.call("LPUSH", KEYS[4], ARGV[8])
    redis.call("LTRIM", KEYS[4], 0, tonumber(ARGV[9]) - 1)
  end
  redis.call("DEL", KEYS[2])
  redis.call("ZREM", KEYS[1], ARGV[1])
end
redis.call("LPUSH", KEYS[3], ARGV[6])
redis.call("LTRIM", KEYS[3], 0, tonumber(ARGV[7]) - 1)
return 1
