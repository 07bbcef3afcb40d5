-- Decides requests against rate limits, atomically. Go builds the keys,
-- reads the clock and derives everything a Result reports besides; this
-- script only reads the counts, decides and writes.
--
-- A call carries one or more requests, decided in order, each against one
-- or more limits (a request is allowed only if every limit admits it).
--   ARGV[1]: the number of requests.
--   ARGV[2]: the number of keys that follow in ARGV, after those of KEYS:
--     0 but for a batch on a Redis Cluster master, which declares only one
--     slot's keys (Redis refuses declared keys of several slots) and passes
--     the others here; the script, declared allow-cross-slot-keys, reads
--     them one by one before it writes anything, so that a key this master
--     does not serve fails the call before any write.
--   Per request: its cost (0 looks without counting), its number of
--     limits, and 1 if a denied request is counted too, else 0.
--   Per limit of the request: its rate, then two numbers that say how to
--     weigh its keys, then the TTL in ms of a key it creates:
--       sliding: the ms left in the current window and the window in ms;
--         its keys are the current and the previous window's.
--       strict: the number of keys and 0; its keys are its sub-windows,
--         current first, each counted in full.
--   KEYS, then the keys in ARGV: per request, per limit, its keys in that
--     order.
-- Reply: per request, 1 if allowed else 0, then per limit its keys' counts
--   as they were before the request; -1 for a value that is not a count.
--
-- A sliding limit admits a request when
--   current + floor(previous * left / window) + cost <= rate.
-- Go validates rate * window <= 2^53, so the product is exact in Lua's
-- doubles. A strict limit admits it when the sum of its keys + cost <= rate.
-- Allowed, each limit's current key grows by the cost: INCRBY keeps the TTL
-- of a key that exists; a new key is SET with its TTL, which outlives every
-- window that reads it. Redis expires keys as of the script's start.
local keys, got, arg = KEYS, nil, 3
if ARGV[2] == '0' then
  got = redis.call('MGET', unpack(KEYS))
else
  keys, got = {}, {}
  for i = 1, #KEYS do keys[i] = KEYS[i] end
  for i = 1, tonumber(ARGV[2]) do keys[#keys + 1] = ARGV[2 + i] end
  for i = 1, #keys do got[i] = redis.call('GET', keys[i]) end
  arg = 3 + tonumber(ARGV[2])
end
-- counts written by earlier requests of this call, by key
local written = ARGV[1] ~= '1' and {} or nil
local reply = {}
local key = 1
for _ = 1, tonumber(ARGV[1]) do
  local cost = tonumber(ARGV[arg])
  local limits = tonumber(ARGV[arg + 1])
  local count_denied = ARGV[arg + 2] == '1'
  local flag = #reply + 1
  local allowed = cost > 0
  reply[flag] = 0
  local k, a = key, arg + 3
  local bad = false
  for _ = 1, limits do
    local rate, weight, window = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local nkeys = window > 0 and 2 or weight
    local usage = 0
    for j = k, k + nkeys - 1 do
      local count = written and written[keys[j]] or tonumber(got[j] or 0)
      if not count or count < 0 or count % 1 ~= 0 then
        -- not a count: this request is denied, unwritten, and reported
        -- with -1, so that one bad value fails no other request
        count, bad = -1, true
      end
      reply[#reply + 1] = count
      usage = usage + count
    end
    if window > 0 then
      local prev = reply[#reply]
      usage = usage - prev + math.floor(prev * weight / window)
    end
    if usage + cost > rate then
      allowed = false
    end
    k, a = k + nkeys, a + 4
  end
  if bad then allowed = false end
  if allowed or (count_denied and cost > 0 and not bad) then
    -- allowed: every limit counts the cost; denied and counting denials:
    -- every limit counts it up to its rate, unless the cost is above the
    -- rate (a request that can never pass is a mistake, not a client to
    -- slow down)
    local r = flag + 1
    k, a = key, arg + 3
    for _ = 1, limits do
      local window = tonumber(ARGV[a + 2])
      local nkeys = window > 0 and 2 or tonumber(ARGV[a + 1])
      local cur, add, add_arg = reply[r], cost, ARGV[arg]
      if not allowed then
        local rate = tonumber(ARGV[a])
        add = cost <= rate and math.max(0, math.min(cost, rate - cur)) or 0
        add_arg = string.format('%d', add)
      end
      if add > 0 then
        if cur == 0 and not got[k] then
          redis.call('SET', keys[k], add_arg, 'PX', ARGV[a + 3])
        else
          redis.call('INCRBY', keys[k], add_arg)
        end
        if written then written[keys[k]] = cur + add end
      end
      r, k, a = r + nkeys, k + nkeys, a + 4
    end
  end
  if allowed then reply[flag] = 1 end
  key, arg = k, arg + 3 + 4 * limits
end
return reply
