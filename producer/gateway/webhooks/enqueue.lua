-- One completion record becomes its deliveries: each one is written unless it
-- already exists (the record handled again after a dispatcher died mid-way),
-- then the record is acked and deleted, in one step: a record is either still
-- on the stream or wholly in the outbox, never both halves lost.
-- KEYS: 1 completion-events stream, 2 outbox, 3.. one delivery hash per delivery
-- ARGV: 1 group, 2 the record's entry id, 3 when the deliveries are due (unix s),
--       then for each delivery (in KEYS order): its id, n, n (field, value) pairs
-- Returns how many deliveries were written.
local at, written = 4, 0
for k = 3, #KEYS do
  local id, n = ARGV[at], tonumber(ARGV[at + 1])
  if redis.call("EXISTS", KEYS[k]) == 0 then
    redis.call("HSET", KEYS[k], unpack(ARGV, at + 2, at + 1 + 2 * n))
    redis.call("ZADD", KEYS[2], ARGV[3], id)
    written = written + 1
  end
  at = at + 2 + 2 * n
end
redis.call("XACK", KEYS[1], ARGV[1], ARGV[2])
redis.call("XDEL", KEYS[1], ARGV[2])
return written
