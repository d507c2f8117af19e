-- inferq admission: one atomic step per submit.
-- KEYS: 1 jobs stream, 2 reply stream, 3 job info hash, 4 idempotency key, 5 rate bucket
-- ARGV: 1 job id, 2 job JSON, 3 max backlog (0 = none), 4 ttl (s) of reply/info/cancel while waiting,
--       5 queued event data, 6 idempotency ttl (s), 7 rate (jobs/s, 0 = off), 8 burst,
--       9 model, 10 tenant, 11 created_at, 12 reply maxlen, 13 use idempotency ("1"/"0"), 14 deadline
-- Returns {"ok", entry id, depth} | {"dup", existing job id} | {"full", depth} | {"rate", retry after s}

if ARGV[13] == "1" then
  local existing = redis.call("GET", KEYS[4])
  if existing then
    return {"dup", existing}
  end
end

local depth = redis.call("XLEN", KEYS[1])
local max_backlog = tonumber(ARGV[3])
if max_backlog > 0 and depth >= max_backlog then
  return {"full", tostring(depth)}
end

local rate = tonumber(ARGV[7])
if rate > 0 then
  local burst = math.max(tonumber(ARGV[8]), 1)
  local t = redis.call("TIME")
  local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
  local state = redis.call("HMGET", KEYS[5], "tokens", "ts")
  local tokens = tonumber(state[1]) or burst
  local ts = tonumber(state[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
  if tokens < 1 then
    return {"rate", tostring((1 - tokens) / rate)}
  end
  redis.call("HSET", KEYS[5], "tokens", tostring(tokens - 1), "ts", tostring(now))
  redis.call("EXPIRE", KEYS[5], math.ceil(burst / rate) + 60)
end

local ttl = tonumber(ARGV[4])
local entry = redis.call("XADD", KEYS[1], "*", "job", ARGV[2])
redis.call("HSET", KEYS[3], "status", "queued", "model", ARGV[9], "tenant", ARGV[10],
  "attempt", "0", "created_at", ARGV[11], "entry_id", entry, "deadline", ARGV[14])
redis.call("EXPIRE", KEYS[3], ttl)
redis.call("XADD", KEYS[2], "MAXLEN", "~", ARGV[12], "*", "type", "queued", "data", ARGV[5])
redis.call("EXPIRE", KEYS[2], ttl)
if ARGV[13] == "1" then
  redis.call("SET", KEYS[4], ARGV[1], "EX", tonumber(ARGV[6]))
end
return {"ok", entry, tostring(depth + 1)}
