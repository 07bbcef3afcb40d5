-- Decides requests against rate limits, atomically. Go builds the keys,
-- reads the clock and derives everything a Result reports besides; this
-- script only reads the counts, decides and writes.
--
-- A key holds a count when it is absent (0) or a string INCRBY takes that is
-- a decimal integer in [0, 2^53]. Anything else (another program's value, a
-- key of another type) fails the request that reads it alone: it is denied,
-- nothing of it is written, and its reply says -1 for that key, so that one
-- foreign key decides no other request of the call. MGET reads a key of
-- another type as absent: the keys it reads as absent are asked EXISTS (the
-- short form for one request reads its two keys with GET instead).
--
-- A sliding limit admits a request when
--   current + floor(previous * left / window) + cost <= rate.
-- Go validates rate * window <= 2^53, so the product is exact in Lua's
-- doubles. A strict limit admits it when the sum of its keys + cost <= rate.
--
-- The script runs alike under Lua 5.1 (Redis, Valkey) and 5.4 (Dragonfly),
-- whose numbers differ: 5.4 keeps integers apart from floats, and its `/`
-- always gives a float. Counts and arguments are integers there, exact in
-- 64 bits, and the few computed numbers are made so that each version gets
-- the same value: previous * left is taken as a float (+ 0.0: an addition in
-- 5.1), since a count above the rate (a charge's) times the window can pass
-- 2^63, where 5.4's integers wrap and 5.1's doubles round; floor returns an
-- integer in 5.4, so every number the script writes or replies is an
-- integer there, and string.format('%d', ...) takes it (5.4 refuses only a
-- float with a fraction, which the script never makes; 5.1 formats a double
-- up to 2^53 exactly). unpack is table.unpack in 5.4.
-- Allowed, each limit's current key grows by the cost: INCRBY keeps the TTL
-- of a key that exists; a new key (in the short form, also one at 0, given
-- back) is SET with its TTL, which outlives every window that reads it.
-- Redis expires keys as of the script's start.
--
-- What the script costs Redis is mostly invoking it (Redis makes a Lua
-- string of every key and argument), each redis.call, and the tables it
-- builds: bench/scriptcost.sh measures it. Hence two forms.
--
-- The short form: one or more requests, each against one sliding limit
-- or one calendar period, the same limit for all, their keys all distinct,
-- not counted when denied (the common decision, and a batch of them).
--   ARGV: the rate, the window in ms, the TTL in ms of a new key (never 0
--     or 1, which tells this form from the long one, whose ARGV[3] is 0 or
--     1; Go makes none below 3 ms), then per request its cost (0 looks
--     without counting) and the ms left in the current window as its clock
--     read it.
--   KEYS: per request, the current window's key and the previous one's; or
--     for a calendar period only its period's key (the count is then that
--     key's alone, and the window and the ms left are not read).
--   Reply: per request, when both its counts are below 2^26, one integer,
--     (current * 2^26 + previous) * 2 + (1 if allowed else 0), which spares
--     Redis a table: for one request that integer itself, for several a list
--     of them. If a count does not pack, the long form's reply.
--
-- The long form: one or more requests, decided in order, each against one or
-- more limits (a request is allowed only if every limit admits it).
--   ARGV[1]: the number of requests.
--   ARGV[2]: the number of keys that follow in ARGV, after those of KEYS:
--     0 but for a batch on a Redis Cluster master, which declares only one
--     slot's keys (Redis refuses declared keys of several slots) and passes
--     the others here; the script, declared allow-cross-slot-keys, reads
--     them one by one with GET (which tells a key of another type by its
--     WRONGTYPE) before it writes anything, so that a key this master does
--     not serve fails the call before any write.
--   ARGV[3]: 1 if a key may appear in more than one request, else 0: then
--     each request sees the counts the ones before it wrote.
--   Per request: its cost (0 looks without counting; below 0 gives back,
--     see below), its number of limits, and its mode: 0, or 1 if a denied
--     request is counted too, 2 if it takes leases, or 3 for a charge, which
--     every limit counts whatever its counts.
--   Per limit of the request: its rate, then two numbers that say how to
--     weigh its keys, then the TTL in ms of a key it creates:
--       sliding: the ms left in the current window and the window in ms;
--         its keys are the current and the previous window's.
--       strict: the number of keys and 0; its keys are its sub-windows,
--         current first, each counted in full.
--     In mode 2, two more: need and most. The limit admits the request when
--     need fits (need 0: always), and then counts min(most, max(need,
--     floor((rate - usage) / 2))): a lease of at most most, and of at most
--     half of what is left beyond what the request needs, so that leases
--     shrink to single requests near the limit. A limit not leased is sent
--     with need and most both the cost.
--   A request of cost -n gives back: each of its limits, strict with one key,
--     has that key lowered by n, never below 0; an absent key stays absent.
--   KEYS, then the keys in ARGV: per request, per limit, its keys in that
--     order.
--   Denied under count-denied, each limit's current key grows by the cost up
--   to its rate; a request that some limit can never admit (its cost is
--   above that rate) is counted nowhere: a mistake, not a client to slow
--   down.
--   A charge whose cost would take some limit's current key past 2^53 (so
--   that it would hold no count), or whose cost is not a count itself, is
--   refused: nothing of it is written. The other modes cannot: each adds at
--   most what its limit's rate leaves above the key, and Go validates every
--   rate at or below 2^53.
--   Reply: per request, 1 if allowed else 0 (2 for a refused charge), then
--     per limit its keys' counts as they were before the request; -1 for a
--     key that holds no count.

local call, tonumber, find, floor = redis.call, tonumber, string.find, math.floor
local argv, keys = ARGV, KEYS

local ttl = argv[3]
if #argv == 5 and ttl ~= '0' and ttl ~= '1' then
  -- the short form for one request: no table of its own (but for a reply
  -- whose counts do not pack), no function, and what it can of its
  -- arguments left unconverted (tonumber is dear: it calls strtod)
  local pcall = redis.pcall
  -- GET, unlike MGET, tells a key of another type (WRONGTYPE, in an error
  -- table, whose length is 0 as the empty string's) from an absent key,
  -- without an EXISTS; two GETs cost Redis less than MGET and EXISTS.
  local c, p = pcall('GET', keys[1]), #keys == 2 and pcall('GET', keys[2])
  local cur, prev = 0, 0
  -- 2^53 has 16 digits: a longer string is more, and one of 16 digits is
  -- compared as a string, since its double may have been rounded to 2^53.
  if c then
    local n = #c
    if n == 0 then
      if type(c) == 'table' and string.sub(c.err, 1, 9) ~= 'WRONGTYPE' then return c end
      cur = -1
    elseif c == '0' or (n < 16 or n == 16 and c <= '9007199254740992') and find(c, '^[1-9]%d*$') then
      cur = tonumber(c)
    else
      cur = -1
    end
  end
  if p then
    local n = #p
    if n == 0 then
      if type(p) == 'table' and string.sub(p.err, 1, 9) ~= 'WRONGTYPE' then return p end
      prev = -1
    elseif p == '0' or (n < 16 or n == 16 and p <= '9007199254740992') and find(p, '^[1-9]%d*$') then
      prev = tonumber(p)
    else
      prev = -1
    end
  end
  local cost, ok = argv[4], 0
  if cost == '1' then cost = 1 else cost = tonumber(cost) end
  if cost > 0 and cur >= 0 and prev >= 0 then
    -- the previous window weighs nothing when it is empty: its time left
    -- and the window are read only when it is not
    local used = cur
    if prev > 0 then used = cur + floor(prev * (tonumber(argv[5]) + 0.0) / tonumber(argv[2])) end
    if used + cost <= tonumber(argv[1]) then
      -- a key at 0 is new or was given back: its TTL may start again
      if cur > 0 then
        call('INCRBY', keys[1], argv[4])
      else
        call('SET', keys[1], argv[4], 'PX', ttl)
      end
      ok = 1
    end
  end
  if cur >= 0 and prev >= 0 and cur < 67108864 and prev < 67108864 then
    return (cur * 67108864 + prev) * 2 + ok
  end
  return {ok, cur, prev}
end

local unpack = table.unpack or unpack

-- parse returns the count a stored string holds, or -1 (the short form
-- for one request says why so).
local function parse(v)
  local n = #v
  if v == '0' or (n < 16 or n == 16 and v <= '9007199254740992') and find(v, '^[1-9]%d*$') then
    return tonumber(v)
  end
  return -1
end

-- memo returns f remembering its results: the arguments of a batch repeat
-- ('1', the rate, the window), counts too, and tonumber is dear.
local function memo(f)
  local seen = {}
  return function(s)
    local v = seen[s]
    if not v then
      v = f(s)
      seen[s] = v
    end
    return v
  end
end

-- count returns the count a stored string holds, or -1.
local count = memo(parse)

-- foreign reports whether some key MGET read as absent (got[i] false)
-- exists, so holds a value of another type.
local function foreign(keys, got)
  local missing, n = nil, 0
  for i = 1, #keys do
    if not got[i] then
      missing = missing or {}
      n = n + 1
      missing[n] = keys[i]
    end
  end
  return n > 0 and call('EXISTS', unpack(missing)) > 0
end

if ttl ~= '0' and ttl ~= '1' then
  -- the short form for several requests
  local rate, window = tonumber(argv[1]), tonumber(argv[2])
  local got = call('MGET', unpack(keys))
  local check = foreign(keys, got)
  for i = 1, #keys do
    local v = got[i]
    if v then
      got[i] = count(v)
    elseif check and call('EXISTS', keys[i]) == 1 then
      got[i] = -1
    else
      got[i] = 0
    end
  end
  -- got holds the counts; reply, per request, its packed integer, or
  -- -1 - allowed for one whose counts do not pack
  local reply, packs = {}, true
  local per = #keys * 2 / (#argv - 3) -- keys per request: 2, or 1 for calendar periods
  for i = 1, #keys / per do
    local cur, prev, a = got[per * i - per + 1], 0, 2 + 2 * i
    if per == 2 then prev = got[2 * i] end
    local cost, ok = argv[a], 0
    if cost == '1' then cost = 1 else cost = tonumber(cost) end
    local used = cur
    if prev > 0 then used = cur + floor(prev * (tonumber(argv[a + 1]) + 0.0) / window) end
    if cost > 0 and cur >= 0 and prev >= 0 and used + cost <= rate then
      if cur > 0 then
        call('INCRBY', keys[per * i - per + 1], argv[a])
      else
        call('SET', keys[per * i - per + 1], argv[a], 'PX', ttl)
      end
      ok = 1
    end
    if cur >= 0 and prev >= 0 and cur < 67108864 and prev < 67108864 then
      reply[i] = (cur * 67108864 + prev) * 2 + ok
    else
      reply[i], packs = -1 - ok, false
    end
  end
  if packs then return reply end
  local long = {}
  for i = 1, #reply do
    local r = reply[i]
    long[3 * i - 2] = r >= 0 and r % 2 or -1 - r
    long[3 * i - 1], long[3 * i] = got[per * i - per + 1], per == 2 and got[2 * i] or 0
  end
  return long
end

-- num returns the number a string argument holds.
local num = memo(tonumber)

local got, arg, nkeys = nil, 4, #keys
if argv[2] == '0' then
  got = call('MGET', unpack(keys))
  if foreign(keys, got) then
    for i = 1, nkeys do -- some key of another type: find which
      if not got[i] and call('EXISTS', keys[i]) == 1 then got[i] = true end
    end
  end
else
  local all = {}
  for i = 1, nkeys do all[i] = keys[i] end
  for i = 1, tonumber(argv[2]) do all[nkeys + i] = argv[3 + i] end
  keys, got = all, {}
  for i = 1, #keys do
    local v = redis.pcall('GET', keys[i])
    if type(v) == 'table' and v.err then
      if string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then return v end
      v = true
    end
    got[i] = v
  end
  arg = 4 + tonumber(argv[2])
end
local written = argv[3] == '1' and {} or nil -- counts written by earlier requests of this call, by key
local reply, nreply = {}, 0
local key = 1
for _ = 1, num(argv[1]) do
  local cost = num(argv[arg])
  local limits = num(argv[arg + 1])
  local mode = argv[arg + 2]
  local count_denied, leased, charge = mode == '1', mode == '2', mode == '3'
  local stride = leased and 6 or 4
  nreply = nreply + 1
  local flag = nreply
  local allowed = cost > 0
  reply[flag] = 0
  local k, a = key, arg + 3
  -- over: a charge refused; it fits when its cost is a count and each
  -- limit's current count is at most room (2^53 - cost, exact, where the
  -- sum count + cost could round to 2^53)
  local bad, never, over = false, false, charge and count(argv[arg]) < 0
  local room = 9007199254740992 - cost
  for _ = 1, limits do
    local rate, weight, window = num(argv[a]), num(argv[a + 1]), num(argv[a + 2])
    local need = cost
    if leased then need = num(argv[a + 4]) elseif charge then need = 0 end
    local nk = window > 0 and 2 or weight
    local usage, c = 0, 0
    for j = k, k + nk - 1 do
      c = written and written[keys[j]]
      if not c then
        local v = got[j]
        if v == true then c = -1 elseif v then c = count(v) else c = 0 end
      end
      if c < 0 then bad = true elseif charge and j == k and c > room then over = true end
      nreply = nreply + 1
      reply[nreply] = c
      usage = usage + c
    end
    if window > 0 then -- c is the previous window's count
      usage = usage - c + floor(c * (weight + 0.0) / window)
    end
    if need > 0 and usage + need > rate then allowed = false end
    if need > rate then never = true end
    k, a = k + nk, a + stride
  end
  if bad or over then allowed = false end
  if cost < 0 and not bad then
    -- give back: lower each limit's one key, never below 0, a key given
    -- twice in the request too
    local r, lowered = flag + 1, {}
    k = key
    for _ = 1, limits do
      local cur = lowered[keys[k]] or reply[r]
      local sub = math.min(cur, -cost)
      if sub > 0 then
        call('DECRBY', keys[k], string.format('%d', sub))
        lowered[keys[k]] = cur - sub
        if written then written[keys[k]] = cur - sub end
      end
      r, k = r + 1, k + 1
    end
  elseif allowed or (count_denied and cost > 0 and not bad and not never) then
    -- allowed: every limit counts the cost (in mode 2, what it leases);
    -- denied and counting denials: every limit counts it up to its rate
    local r = flag + 1
    k, a = key, arg + 3
    for _ = 1, limits do
      local rate, window = num(argv[a]), num(argv[a + 2])
      local nk = window > 0 and 2 or num(argv[a + 1])
      local cur, add, add_arg = reply[r], cost, argv[arg]
      if leased then
        local usage = cur
        if window > 0 then
          usage = usage + floor(reply[r + 1] * (num(argv[a + 1]) + 0.0) / window)
        else
          for j = r + 1, r + nk - 1 do usage = usage + reply[j] end
        end
        add = math.min(num(argv[a + 5]), math.max(num(argv[a + 4]), floor((rate - usage) / 2)))
        add_arg = add == num(argv[a + 5]) and argv[a + 5] or string.format('%d', add)
      elseif not allowed then
        add = math.max(0, math.min(cost, rate - cur))
        add_arg = string.format('%d', add)
      end
      if add > 0 then
        if cur == 0 and not got[k] then
          call('SET', keys[k], add_arg, 'PX', argv[a + 3])
        else
          call('INCRBY', keys[k], add_arg)
        end
        if written then written[keys[k]] = cur + add end
      end
      r, k, a = r + nk, k + nk, a + stride
    end
  end
  if allowed then reply[flag] = 1 elseif over and not bad then reply[flag] = 2 end
  key, arg = k, arg + 3 + stride * limits
end
return reply
