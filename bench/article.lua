-- The script of the reference article "Rate Limiting Architectures: Sliding
-- Window Counter Algorithm with Redis" (shared/reference), as it stands there:
-- GET, GET, then INCR and EXPIRE when allowed. It is the ceiling a library
-- speaking this script could reach: the bench sends it by a bare EVALSHA.
--
-- KEYS: the current window's key, then the previous window's.
-- ARGV: the limit, the window in seconds, the time now in seconds.
-- Reply: {1 if allowed else 0, the estimate (with this request if allowed)}.
local current_key = KEYS[1]
local prev_key = KEYS[2]
local max_limit = tonumber(ARGV[1])
local window_size = tonumber(ARGV[2])
local now = tonumber(ARGV[3])

local current_count = tonumber(redis.call('get', current_key) or "0")
local prev_count = tonumber(redis.call('get', prev_key) or "0")

local current_window_start = math.floor(now / window_size) * window_size
local time_into_current = now - current_window_start
local prev_weight = (window_size - time_into_current) / window_size

local estimated_requests = math.floor(prev_count * prev_weight + current_count)

if estimated_requests >= max_limit then
    return {0, estimated_requests}
else
    redis.call('incr', current_key)
    redis.call('expire', current_key, window_size * 2)
    return {1, estimated_requests + 1}
end
