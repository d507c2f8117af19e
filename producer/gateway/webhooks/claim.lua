-- Take the deliveries that are due: each one's score moves to the end of the
-- lease, so no other dispatcher takes it meanwhile; one whose dispatcher died
-- is due again once the lease has passed.
-- KEYS: 1 outbox
-- ARGV: 1 now (unix s), 2 lease end (unix s), 3 most to take
-- Returns the delivery ids taken.
local due = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1], "LIMIT", 0, tonumber(ARGV[3]))
for _, id in ipairs(due) do
  redis.call("ZADD", KEYS[1], "XX", ARGV[2], id)
end
return due
