-- inferq admission: one atomic step per submit.
-- KEYS (one partition's slot): 1 the lane's job stream, 2 reply stream, 3 job info hash,
--       4 idempotency key, 5 rate bucket, 6 cancel flag, 7 the partition's set of extra lanes
-- ARGV: 1 job id, 2 max backlog (0 = none), 3 ttl (s) of reply/info while waiting, 4 idempotency ttl (s),
--       5 rate (jobs/s, 0 = off), 6 burst, 7 reply maxlen, 8 use idempotency ("1"/"0"),
--       9 name of the info field that gets the job's entry id,
--       10 reset ("1": a re-admission, e.g. from the DLQ: the job's old reply stream, record and
--          cancel flag are deleted here, after every check passed, so a refusal loses nothing),
--       11 the lane as recorded in KEYS[7] ("": the default lane, not recorded),
--       then three field lists, each as a count followed by field/value pairs, written exactly as
--       given (their names come from schemas): the job entry, the queued event, the job info hash.
-- Returns {"ok", entry id, depth} | {"dup", existing job id} | {"full", depth} | {"rate", retry after s}

local function fields(at)
  local n = tonumber(ARGV[at])
  local out = {}
  for i = 1, n do
    out[i] = ARGV[at + i]
  end
  return out, at + n + 1
end

if ARGV[8] == "1" then
  local existing = redis.call("GET", KEYS[4])
  if existing then
    return {"dup", existing}
  end
end

local depth = redis.call("XLEN", KEYS[1])
local max_backlog = tonumber(ARGV[2])
if max_backlog > 0 and depth >= max_backlog then
  return {"full", tostring(depth)}
end

local rate = tonumber(ARGV[5])
if rate > 0 then
  local burst = math.max(tonumber(ARGV[6]), 1)
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

if ARGV[10] == "1" then
  redis.call("DEL", KEYS[2], KEYS[3], KEYS[6])
end

local job_fields, next_at = fields(12)
local event_fields, info_at = fields(next_at)
local info_fields = fields(info_at)

local ttl = tonumber(ARGV[3])
local entry = redis.call("XADD", KEYS[1], "*", unpack(job_fields))
if ARGV[11] ~= "" then
  redis.call("SADD", KEYS[7], ARGV[11])
end
redis.call("HSET", KEYS[3], ARGV[9], entry, unpack(info_fields))
redis.call("EXPIRE", KEYS[3], ttl)
redis.call("XADD", KEYS[2], "MAXLEN", "~", ARGV[7], "*", unpack(event_fields))
redis.call("EXPIRE", KEYS[2], ttl)
if ARGV[8] == "1" then
  redis.call("SET", KEYS[4], ARGV[1], "EX", tonumber(ARGV[4]))
end
return {"ok", entry, tostring(depth + 1)}
