-- Decides one request of one id against one or more sliding-window limits,
-- atomically. Go builds the keys and reads the clock; this script only reads
-- the counts, decides and writes.
--
-- KEYS: for each limit, the current window's key, then the previous window's.
-- ARGV[1]: the cost; 0 looks without consuming anything.
-- ARGV[2..]: for each limit, three numbers: the rate, the window in ms, and the
--   ms left in the current window.
-- Reply: {1 if allowed else 0, then for each limit the current and previous
--   counts as they were before this request}.
--
-- A request is allowed when, for every limit,
--   current + floor(previous * left / window) + cost <= rate.
-- Go validates rate * window <= 2^53, so the product is exact in Lua's doubles.
-- Allowed, each current key gets the new count and a TTL of two windows: one
-- SET, not INCRBY then PEXPIRE, to keep to one write per key.
local cost = tonumber(ARGV[1])
local counts = redis.call('MGET', unpack(KEYS))
local reply = {cost > 0 and 1 or 0}
for k = 1, #KEYS, 2 do
  local a = (k - 1) / 2 * 3 + 2
  local rate, window, left = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cur, prev = tonumber(counts[k] or 0), tonumber(counts[k + 1] or 0)
  if cur + math.floor(prev * left / window) + cost > rate then
    reply[1] = 0
  end
  reply[k + 1], reply[k + 2] = cur, prev
end
if reply[1] == 1 then
  for k = 1, #KEYS, 2 do
    local window = tonumber(ARGV[(k - 1) / 2 * 3 + 3])
    redis.call('SET', KEYS[k], reply[k + 1] + cost, 'PX', 2 * window)
  end
end
return reply
