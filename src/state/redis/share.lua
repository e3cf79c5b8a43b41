-- share(): counts a download's session against its client's share, and returns the sessions the
-- client gives up to stay within it, its least recently written first (never this one).
--
-- KEYS[1]  the client's sessions: a sorted set of session members, by last write
-- ARGV[1]  the session member      ARGV[2] now, Unix seconds
-- ARGV[3]  TTL in milliseconds     ARGV[4] TTL in seconds
-- ARGV[5]  the most sessions the client may hold
-- Returns the members given up.

local key, member, now = KEYS[1], ARGV[1], tonumber(ARGV[2])
local most = tonumber(ARGV[5])

redis.call('ZREM', key, member)
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. (now - tonumber(ARGV[4])))
local given_up = {}
local over = redis.call('ZCARD', key) + 1 - most
if over > 0 then
  local popped = redis.call('ZPOPMIN', key, over)
  for i = 1, #popped, 2 do
    given_up[#given_up + 1] = popped[i]
  end
end
redis.call('ZADD', key, now, member)
redis.call('PEXPIRE', key, ARGV[3])
return given_up
