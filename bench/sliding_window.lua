-- Decides requests against sliding-window limits, atomically. Go builds the
-- keys and reads the clock; this script only reads the counts, decides and
-- writes.
--
-- A call carries one or more requests, decided in order, each against one
-- or more limits (all must pass). For each limit of each request:
--   KEYS: the current window's key, then the previous window's.
--   ARGV: per request, its cost (0 looks without consuming) and its number
--     of limits; then per limit the rate, the window in ms, and the ms left
--     in the current window.
-- Reply: per request, 1 if allowed else 0, then per limit the current and
--   previous counts as they were before this request.
--
-- A request is allowed when, for every limit,
--   current + floor(previous * left / window) + cost <= rate.
-- Go validates rate * window <= 2^53, so the product is exact in Lua's doubles.
-- Allowed, each current count is set with a TTL of two windows: one SET, not
-- INCRBY then PEXPIRE, to keep to one write per key.
local got = redis.call('MGET', unpack(KEYS))
local count = {} -- key -> count, once a request in this call has written it
local function read(k)
  return count[KEYS[k]] or tonumber(got[k] or 0)
end

local reply, k, a = {}, 1, 1
while a <= #ARGV do
  local cost, limits = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local flag = #reply + 1
  reply[flag] = cost > 0 and 1 or 0
  for j = 0, limits - 1 do
    local rate, window, left = tonumber(ARGV[a + 2 + 3 * j]), tonumber(ARGV[a + 3 + 3 * j]), tonumber(ARGV[a + 4 + 3 * j])
    local cur, prev = read(k + 2 * j), read(k + 2 * j + 1)
    if cur + math.floor(prev * left / window) + cost > rate then
      reply[flag] = 0
    end
    reply[flag + 1 + 2 * j], reply[flag + 2 + 2 * j] = cur, prev
  end
  if reply[flag] == 1 then
    for j = 0, limits - 1 do
      local key, next = KEYS[k + 2 * j], reply[flag + 1 + 2 * j] + cost
      count[key] = next
      redis.call('SET', key, next, 'PX', 2 * tonumber(ARGV[a + 3 + 3 * j]))
    end
  end
  k, a = k + 2 * limits, a + 2 + 3 * limits
end
return reply
