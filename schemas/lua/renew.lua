-- Lease renewal: reset the idle time of the entries this consumer still owns
-- (XCLAIM JUSTID does not count a delivery); never touches an entry another
-- consumer claimed meanwhile (the check and the claim are one atomic step).
-- KEYS: 1 job stream
-- ARGV: 1 group, 2 consumer, 3.. entry ids
-- Returns the ids this consumer no longer owns.
local lost = {}
local mine = {}
for i = 3, #ARGV do
  if owns_entry(KEYS[1], ARGV[1], ARGV[i], ARGV[2]) then
    mine[#mine + 1] = ARGV[i]
  else
    lost[#lost + 1] = ARGV[i]
  end
end
if #mine > 0 then
  redis.call("XCLAIM", KEYS[1], ARGV[1], ARGV[2], 0, unpack(mine), "JUSTID")
end
return lost
