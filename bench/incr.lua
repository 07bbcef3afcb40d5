-- The bare counter that the library's script is weighed against: a fixed
-- window's count, INCR then PEXPIRE of one key, and nothing else (no previous
-- window, no decision in Redis). The bench's bare/incr sends it by a bare
-- EVALSHA; the root module's BenchmarkScriptCost measures the same two
-- commands as bare-incr-pexpire.
--
-- KEYS: the current window's key, in the library's format.
-- ARGV: the key's TTL in ms (two windows, as the library gives a new key).
-- Reply: the count, this request included.
local count = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return count
