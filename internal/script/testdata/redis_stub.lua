-- A stand-in for Redis that runs the library's scripts under the Lua that
-- runs this file (lua5.1 as Redis and Valkey, lua5.4 as Dragonfly), for
-- lua_test.go: an in-memory store of the commands the scripts call, as
-- strict as the strictest engine about keys. A command touching a key not
-- in KEYS fails (Dragonfly: "script tried accessing undeclared key"), and
-- in cluster mode so do declared keys of several slots (Redis Cluster's
-- CROSSSLOT) and a command whose keys are in another slot than the
-- declared ones, unless the script's shebang says allow-cross-slot-keys:
-- then, as on a Redis Cluster master, its keys may be of any slot and
-- undeclared (Dragonfly would want allow-undeclared-keys).
--
-- It reads requests on stdin and writes one reply per request on stdout.
-- A string is sent as its length on a line, then its bytes and a newline.
--   L <src>                      load a script: replies its number
--   E <n> <cluster> <count> <args...>  run script n: args are numkeys, the
--                                keys, then ARGV, as EVAL takes them
--   T <sec> <usec>               the clock TIME reads and keys expire by
--   F <kind> <key>               make key foreign: kind s (a string that
--                                holds no count) or l (a list)
--   S <key>                      the key's Cluster hash slot
--   D                            every key: {key, type, value, expire-at ms
--                                or -1}, in key order
-- A reply is encoded as i<integer>, f<float> (a non-integer number: a Lua
-- 5.4 float, which no engine should be handed), s<len>, e<len> (an error),
-- o<len> (a status) each string's bytes following, n (nil), or a<n>
-- followed by n replies; each header ends with a newline.

local unpack = table.unpack or unpack
local load = loadstring or load
local floor = math.floor
local mathtype = math.type -- nil in 5.1, whose numbers are all doubles

-- integer formats n, an integral number up to 2^53, as a decimal integer
-- (5.1's tostring would give 9.007199254741e+15).
local function integer(n)
  return string.format('%.0f', n)
end

local function isint(s)
  return type(s) == 'string' and (s == '0' or string.find(s, '^%-?[1-9]%d*$') ~= nil) and #s <= 17
end

-- crc16 is CRC16/XMODEM, Redis Cluster's key hash, without bit operators
-- (5.1 has none).
local function bxor(a, b)
  local r, bit = 0, 1
  while a > 0 or b > 0 do
    if a % 2 ~= b % 2 then r = r + bit end
    a, b, bit = floor(a / 2), floor(b / 2), bit * 2
  end
  return r
end
local crctab = {}
for i = 0, 255 do
  local c = i * 256
  for _ = 1, 8 do
    if c >= 32768 then c = bxor((c * 2) % 65536, 4129) else c = (c * 2) % 65536 end
  end
  crctab[i] = c
end
local function crc16(s)
  local crc = 0
  for i = 1, #s do
    crc = bxor((crc % 256) * 256, crctab[bxor(floor(crc / 256), string.byte(s, i))])
  end
  return crc
end

-- slot returns the Cluster hash slot of key: of its hash tag, the bytes
-- between its first { and the next }, when there are some.
local slots = {}
local function slot(key)
  local s = slots[key]
  if s then return s end
  local open = string.find(key, '{', 1, true)
  local tag = key
  if open then
    local close = string.find(key, '}', open + 1, true)
    if close and close > open + 1 then tag = string.sub(key, open + 1, close - 1) end
  end
  s = crc16(tag) % 16384
  slots[key] = s
  return s
end

local now = 0          -- ms
local sec, usec = '0', '0'
local data = {}        -- key: {t = 'string', v = s} | {t = 'zset', m = {member = score}} | {t = 'list', v = {...}}
local expires = {}     -- key: ms

local function fail(msg) error({err = msg}, 0) end

local function lookup(key)
  local at = expires[key]
  if at and at <= now then
    data[key], expires[key] = nil, nil
  end
  return data[key]
end

local function wrongtype()
  fail('WRONGTYPE Operation against a key holding the wrong kind of value')
end

local function zset(key, create)
  local e = lookup(key)
  if not e then
    if not create then return nil end
    e = {t = 'zset', m = {}}
    data[key] = e
  elseif e.t ~= 'zset' then
    wrongtype()
  end
  return e
end

local function score(s)
  if s == '-inf' then return -math.huge elseif s == '+inf' or s == 'inf' then return math.huge end
  local n = tonumber(s)
  if not n then fail('ERR min or max is not a float') end
  return n
end

local function fmtscore(n) return string.format('%.17g', n) end

-- sorted returns the members of z ordered as Redis orders them.
local function sorted(z)
  local all = {}
  for m, s in pairs(z.m) do all[#all + 1] = {m, s} end
  table.sort(all, function(a, b)
    if a[2] ~= b[2] then return a[2] < b[2] end
    return a[1] < b[1]
  end)
  return all
end

local function drop_if_empty(key, z)
  if next(z.m) == nil then data[key], expires[key] = nil, nil end
end

local function incrby(key, by)
  if not isint(by) then fail('ERR value is not an integer or out of range') end
  local e = lookup(key)
  local cur = 0
  if e then
    if e.t ~= 'string' then wrongtype() end
    if not isint(e.v) then fail('ERR value is not an integer or out of range') end
    cur = tonumber(e.v)
  end
  local n = cur + tonumber(by)
  if n > 9007199254740992 or n < -9007199254740992 then
    fail('stub: INCRBY ' .. key .. ' ' .. integer(cur) .. ' by ' .. by .. ' past 2^53, which this stand-in does not count exactly')
  end
  if e then e.v = integer(n) else data[key] = {t = 'string', v = integer(n)} end
  return n
end

-- commands: name = {index of the first key (0: none), every argument from
-- it a key, the command}
local commands = {
  GET = {1, false, function(k)
    local e = lookup(k)
    if not e then return false end
    if e.t ~= 'string' then wrongtype() end
    return e.v
  end},
  MGET = {1, true, function(...)
    local out = {}
    for i, k in ipairs({...}) do
      local e = lookup(k)
      out[i] = e and e.t == 'string' and e.v or false
    end
    return out
  end},
  EXISTS = {1, true, function(...)
    local n = 0
    for _, k in ipairs({...}) do if lookup(k) then n = n + 1 end end
    return n
  end},
  SET = {1, false, function(k, v, opt, ms)
    if opt == nil then
      data[k], expires[k] = {t = 'string', v = v}, nil
    elseif opt == 'PX' and isint(ms) and tonumber(ms) > 0 then
      data[k], expires[k] = {t = 'string', v = v}, now + tonumber(ms)
    else
      fail('ERR syntax error')
    end
    return {ok = 'OK'}
  end},
  INCRBY = {1, false, incrby},
  DECRBY = {1, false, function(k, by)
    if not isint(by) then fail('ERR value is not an integer or out of range') end
    return incrby(k, by == '0' and '0' or (string.sub(by, 1, 1) == '-' and string.sub(by, 2) or '-' .. by))
  end},
  TIME = {0, false, function() return {sec, usec} end},
  ZADD = {1, false, function(k, ...)
    local a = {...}
    local xx = a[1] == 'XX'
    if xx then table.remove(a, 1) end
    if #a ~= 2 then fail('stub: ZADD takes [XX] score member') end
    local s = tonumber(a[1])
    if not s then fail('ERR value is not a valid float') end
    local z = zset(k, not xx)
    if not z then return 0 end
    local added = z.m[a[2]] == nil and 1 or 0
    if xx and added == 1 then return 0 end
    z.m[a[2]] = s
    return added
  end},
  ZREM = {1, false, function(k, m)
    local z = zset(k, false)
    if not z or z.m[m] == nil then return 0 end
    z.m[m] = nil
    drop_if_empty(k, z)
    return 1
  end},
  ZREMRANGEBYSCORE = {1, false, function(k, min, max)
    local z = zset(k, false)
    if not z then return 0 end
    local lo, hi, n = score(min), score(max), 0
    for m, s in pairs(z.m) do
      if s >= lo and s <= hi then z.m[m], n = nil, n + 1 end
    end
    drop_if_empty(k, z)
    return n
  end},
  ZCARD = {1, false, function(k)
    local z = zset(k, false)
    local n = 0
    if z then for _ in pairs(z.m) do n = n + 1 end end
    return n
  end},
  ZRANGE = {1, false, function(k, start, stop, withscores)
    local z = zset(k, false)
    if not z then return {} end
    local all = sorted(z)
    local i, j = tonumber(start), tonumber(stop)
    if i < 0 then i = #all + i end
    if j < 0 then j = #all + j end
    if i < 0 then i = 0 end
    local out = {}
    for x = i, math.min(j, #all - 1) do
      out[#out + 1] = all[x + 1][1]
      if withscores == 'WITHSCORES' then out[#out + 1] = fmtscore(all[x + 1][2]) end
    end
    return out
  end},
  ZSCORE = {1, false, function(k, m)
    local z = zset(k, false)
    if not z or z.m[m] == nil then return false end
    return fmtscore(z.m[m])
  end},
  PEXPIREAT = {1, false, function(k, at)
    if not lookup(k) then return 0 end
    if not isint(at) then fail('ERR value is not an integer or out of range') end
    expires[k] = tonumber(at)
    lookup(k)
    return 1
  end},
}

-- The call under way: its declared keys, the slot they hash to, and
-- whether it runs as on a Cluster, allowing keys of any slot.
local declared, declslot, cluster, cross = {}, nil, false, false

-- check fails a command whose keys the engines would refuse.
local function check(name, keys)
  local first
  for _, k in ipairs(keys) do
    if not cross and not declared[k] then
      fail('stub: script tried accessing undeclared key ' .. k .. ' (' .. name .. ')')
    end
    if cluster then
      local s = slot(k)
      first = first or s
      if s ~= first then fail('stub: CROSSSLOT keys of ' .. name .. ' in slots ' .. first .. ' and ' .. s) end
      if not cross and s ~= declslot then
        fail('stub: ' .. name .. ' touched key ' .. k .. ' of slot ' .. s .. ', not the declared slot ' .. declslot)
      end
    end
  end
end

local function run(name, ...)
  local args = {...}
  local n = select('#', ...)
  for i = 1, n do
    local a = args[i]
    if type(a) == 'number' then
      args[i] = tostring(a) -- as the engine would: 5.4 writes a float with ".0"
    elseif type(a) ~= 'string' then
      fail('ERR Lua redis lib command arguments must be strings or integers')
    end
  end
  local c = commands[string.upper(name)]
  if not c then fail('stub: unknown command ' .. tostring(name)) end
  local keys = {}
  if c[1] > 0 then
    local last = c[2] and n or c[1]
    for i = c[1], last do keys[#keys + 1] = args[i] end
  end
  check(name, keys)
  return c[3](unpack(args, 1, n))
end

redis = {
  call = function(...) return run(...) end,
  pcall = function(...)
    local ok, r = pcall(run, ...)
    if ok then return r end
    if type(r) == 'table' then return r end
    return {err = tostring(r)}
  end,
}

-- I/O

local out = {}
local function put(s) out[#out + 1] = s end

local function isinteger(v)
  if mathtype then return mathtype(v) == 'integer' end
  return v == floor(v) and v >= -9007199254740992 and v <= 9007199254740992
end

local function encode(v)
  local t = type(v)
  if t == 'number' then
    if isinteger(v) then put('i' .. integer(v) .. '\n') else put('f' .. string.format('%.17g', v) .. '\n') end
  elseif t == 'string' then
    put('s' .. #v .. '\n' .. v)
  elseif t == 'boolean' then
    if v then put('i1\n') else put('n\n') end
  elseif t == 'table' then
    if v.err then
      put('e' .. #tostring(v.err) .. '\n' .. tostring(v.err))
    elseif v.ok then
      put('o' .. #v.ok .. '\n' .. v.ok)
    else
      local n = 0
      while v[n + 1] ~= nil do n = n + 1 end
      put('a' .. n .. '\n')
      for i = 1, n do encode(v[i]) end
    end
  else
    put('n\n')
  end
end

local function readstring()
  local n = tonumber(io.read('*l'))
  local s = n > 0 and io.read(n) or ''
  io.read('*l')
  return s
end

local scripts = {}

while true do
  local line = io.read('*l')
  if not line then break end
  local op = string.sub(line, 1, 1)
  local fields = {}
  for f in string.gmatch(line, '%S+') do fields[#fields + 1] = f end
  if op == 'L' then
    local src = readstring()
    local flags = {}
    if string.sub(src, 1, 5) == '#!lua' then
      local nl = string.find(src, '\n', 1, true)
      local shebang = string.sub(src, 1, nl - 1)
      src = string.sub(src, nl + 1)
      local list = string.match(shebang, 'flags=(%S*)') or ''
      for f in string.gmatch(list, '[^,]+') do
        if f ~= 'allow-cross-slot-keys' and f ~= 'no-writes' then
          error('stub: unexpected flag in script shebang: ' .. f)
        end
        flags[f] = true
      end
    end
    local f, err = load(src, '=user_script')
    if not f then
      encode({err = 'compiling script: ' .. err})
    else
      scripts[#scripts + 1] = {f = f, cross = flags['allow-cross-slot-keys'] or false}
      encode(#scripts)
    end
  elseif op == 'E' then
    local s = scripts[tonumber(fields[2])]
    cluster = fields[3] == '1'
    local args = {}
    for i = 1, tonumber(fields[4]) do args[i] = readstring() end
    local nkeys = tonumber(args[1])
    KEYS, ARGV = {}, {}
    for i = 1, nkeys do KEYS[i] = args[1 + i] end
    for i = nkeys + 2, #args do ARGV[#ARGV + 1] = args[i] end
    declared, declslot, cross = {}, nil, s.cross
    local refused
    for _, k in ipairs(KEYS) do
      declared[k] = true
      if cluster then
        declslot = declslot or slot(k)
        if slot(k) ~= declslot then refused = 'CROSSSLOT Keys in request don\'t hash to the same slot' end
      end
    end
    if refused then
      encode({err = refused})
    else
      local ok, r = pcall(s.f)
      if ok then
        encode(r)
      elseif type(r) == 'table' and r.err then
        encode({err = r.err})
      else
        encode({err = 'script: ' .. tostring(r)})
      end
    end
  elseif op == 'T' then
    sec, usec = fields[2], fields[3]
    now = tonumber(sec) * 1000 + floor(tonumber(usec) / 1000)
    encode({ok = 'OK'})
  elseif op == 'F' then
    local key = readstring()
    if fields[2] == 'l' then
      data[key] = {t = 'list', v = {'x'}}
    else
      data[key] = {t = 'string', v = 'not a count'}
    end
    expires[key] = nil
    encode({ok = 'OK'})
  elseif op == 'S' then
    encode(slot(readstring()))
  elseif op == 'D' then
    local names = {}
    for k in pairs(data) do
      if lookup(k) then names[#names + 1] = k end
    end
    table.sort(names)
    local all = {}
    for _, k in ipairs(names) do
      local e, v = data[k], nil
      if e.t == 'string' then
        v = e.v
      elseif e.t == 'list' then
        v = e.v
      else
        v = {}
        for _, p in ipairs(sorted(e)) do v[#v + 1] = p[1]; v[#v + 1] = fmtscore(p[2]) end
      end
      all[#all + 1] = {k, e.t, v, expires[k] or -1}
    end
    encode(all)
  else
    error('stub: unknown request ' .. line)
  end
  io.write(table.concat(out))
  io.flush()
  out = {}
end
