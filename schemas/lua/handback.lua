-- Hand entries back to the group on a graceful stop: each one this consumer
-- still owns is marked idle past the reapers' threshold, so another worker
-- takes it at its next reap instead of waiting three leases.
-- KEYS: 1 job stream
-- ARGV: 1 group, 2 consumer, 3 idle (ms) to set, 4.. entry ids
-- Returns how many were handed back.
local n = 0
for i = 4, #ARGV do
  if owns_entry(KEYS[1], ARGV[1], ARGV[i], ARGV[2]) then
    redis.call("XCLAIM", KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], "IDLE", tonumber(ARGV[3]), "JUSTID")
    n = n + 1
  end
end
return n
