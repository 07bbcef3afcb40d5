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
--   as they were before the request; -1 for a key that holds no count.
--
-- A key holds a count when it is absent (0) or a string INCRBY takes that
-- is a decimal integer in [0, 2^53]. Anything else (another program's value,
-- a key of another type) fails the request that reads it alone: it is
-- denied, nothing of it is written, and its reply says -1 for that key, so
-- that one foreign key decides no other request of the call.
--
-- A sliding limit admits a request when
--   current + floor(previous * left / window) + cost <= rate.
-- Go validates rate * window <= 2^53, so the product is exact in Lua's
-- doubles. A strict limit admits it when the sum of its keys + cost <= rate.
-- Allowed, each limit's current key grows by the cost: INCRBY keeps the TTL
-- of a key that exists; a new key is SET with its TTL, which outlives every
-- window that reads it. Redis expires keys as of the script's start.
--
-- Denied under count-denied, each limit's current key grows by the cost up
-- to its rate; a request that some limit can never admit (its cost is above
-- that rate) is counted nowhere: it is a mistake, not a client to slow down.

-- count returns the count a stored string holds, or nil if it holds none.
-- 2^53 has 16 digits: a longer string is more, and one of 16 digits is
-- compared as a string, since its double may have been rounded down to it.
local function count(v)
  if v == '0' then return 0 end
  local n = #v
  if (n < 16 or n == 16 and v <= '9007199254740992') and string.find(v, '^[1-9]%d*$') then
    return tonumber(v)
  end
  return nil
end

-- got[i] is keys[i]'s value: a string, false when the key is absent or of
-- another type (MGET cannot tell), or true when it is of another type.
local keys, got, arg = KEYS, nil, 3
if ARGV[2] == '0' then
  got = redis.call('MGET', unpack(KEYS))
else
  keys, got = {}, {}
  for i = 1, #KEYS do keys[i] = KEYS[i] end
  for i = 1, tonumber(ARGV[2]) do keys[#keys + 1] = ARGV[2 + i] end
  for i = 1, #keys do
    local v = redis.pcall('GET', keys[i])
    if type(v) == 'table' and v.err then
      if string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then return v end
      v = true
    end
    got[i] = v
  end
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
  local bad, never = false, false
  local absent = nil -- keys read as absent, which may be of another type
  for _ = 1, limits do
    local rate, weight, window = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local nkeys = window > 0 and 2 or weight
    local usage = 0
    for j = k, k + nkeys - 1 do
      local c = written and written[keys[j]]
      if not c then
        local v = got[j]
        if v == true then
          c = nil
        elseif v then
          c = count(v)
        else
          c = 0
          if ARGV[2] == '0' then
            absent = absent or {}
            absent[#absent + 1] = keys[j]
          end
        end
      end
      if not c then
        c, bad = -1, true
      end
      reply[#reply + 1] = c
      usage = usage + c
    end
    if window > 0 then
      local prev = reply[#reply]
      usage = usage - prev + math.floor(prev * weight / window)
    end
    if usage + cost > rate then
      allowed = false
    end
    if cost > rate then never = true end
    k, a = k + nkeys, a + 4
  end
  if absent and not bad then
    -- MGET reads a key of another type as absent: one that exists is
    -- foreign, and would be overwritten by SET
    if redis.call('EXISTS', unpack(absent)) > 0 then
      bad = true
      local r = flag + 1
      for j = key, k - 1 do
        if not (written and written[keys[j]]) and not got[j] and redis.call('EXISTS', keys[j]) == 1 then
          reply[r] = -1
        end
        r = r + 1
      end
    end
  end
  if bad then allowed = false end
  if allowed or (count_denied and cost > 0 and not bad and not never) then
    -- allowed: every limit counts the cost; denied and counting denials:
    -- every limit counts it up to its rate
    local r = flag + 1
    k, a = key, arg + 3
    for _ = 1, limits do
      local window = tonumber(ARGV[a + 2])
      local nkeys = window > 0 and 2 or tonumber(ARGV[a + 1])
      local cur, add, add_arg = reply[r], cost, ARGV[arg]
      if not allowed then
        add = math.max(0, math.min(cost, tonumber(ARGV[a]) - cur))
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
