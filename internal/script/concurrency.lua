-- Concurrency slots of one id: a sorted set whose members are the held
-- slots' tokens, each scored by the ms, on Redis's clock, when its lease
-- ends. A lease that has ended frees its slot by itself: every call first
-- drops them. The set expires with its last lease, so an id that holds no
-- slot keeps no key.
--
-- KEYS[1]: the set.
-- ARGV[1]: 'a' to acquire, 'r' to release, 'e' to extend; ARGV[2]: the
-- slot's token; ARGV[3]: the most slots (acquire); ARGV[4]: the lease in
-- ms (acquire, extend).
-- Reply: {1 if it acquired, released or extended, else 0; the slots held
-- after an acquire or extend (0 for a release); for an acquire that found
-- every slot held, the ms until enough leases end for one to be free (the
-- earliest, unless max was lowered below what is held), else 0}.

local key, op, token = KEYS[1], ARGV[1], ARGV[2]
if op == 'r' then
  -- a release needs no clock: a token whose lease ended is gone or going
  return {redis.call('ZREM', key, token), 0, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local held = redis.call('ZCARD', key)

-- expire has the set live as long as its last lease.
local function expire()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', key, last[2])
  end
end

if op == 'a' then
  if held < tonumber(ARGV[3]) then
    redis.call('ZADD', key, now + tonumber(ARGV[4]), token)
    expire()
    return {1, held + 1, 0}
  end
  -- the lease whose end brings the held under max (max may have been
  -- lowered below what is held)
  local i = held - tonumber(ARGV[3])
  local free = redis.call('ZRANGE', key, i, i, 'WITHSCORES')
  return {0, held, tonumber(free[2]) - now}
end
if redis.call('ZSCORE', key, token) then
  redis.call('ZADD', key, 'XX', now + tonumber(ARGV[4]), token)
  expire()
  return {1, held, 0}
end
return {0, held, 0}
