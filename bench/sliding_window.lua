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
-- INCRBY then PEXPIRE, to keep to one write per key. Its numbers are
-- formatted here with string.format: given Lua numbers, Redis would format
-- them with %.17g, which costs more than the whole SET.
local got = redis.call('MGET', unpack(KEYS))
local nargs = #ARGV
-- key -> count once written, needed only when a call holds several requests
local written = nargs > 5 and {} or nil
local reply, k, a = {}, 1, 1
while a <= nargs do
  local cost, limits = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local flag = #reply + 1
  local ok = cost > 0
  for j = 0, limits - 1 do
    local b, c = a + 2 + 3 * j, k + 2 * j
    local cur = written and written[KEYS[c]] or tonumber(got[c] or 0)
    local prev = written and written[KEYS[c + 1]] or tonumber(got[c + 1] or 0)
    if cur + math.floor(prev * tonumber(ARGV[b + 2]) / tonumber(ARGV[b + 1])) + cost > tonumber(ARGV[b]) then
      ok = false
    end
    reply[flag + 1 + 2 * j], reply[flag + 2 + 2 * j] = cur, prev
  end
  reply[flag] = ok and 1 or 0
  if ok then
    for j = 0, limits - 1 do
      local key, next = KEYS[k + 2 * j], reply[flag + 1 + 2 * j] + cost
      if written then written[key] = next end
      redis.call('SET', key, string.format('%d', next), 'PX', string.format('%d', 2 * tonumber(ARGV[a + 3 + 3 * j])))
    end
  end
  k, a = k + 2 * limits, a + 2 + 3 * limits
end
return reply
