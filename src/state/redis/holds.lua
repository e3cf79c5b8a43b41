-- hold(), release(), renew(): the downloads under way on one route, counted for every instance
-- that shares the store ([routes.download_limits]). Each instance holds a lease per download it
-- serves; a lease not renewed within its time (an instance killed, or cut off from Redis) lapses,
-- and its download stops counting. A download served by several instances at once (the pieces of
-- one aria2c download, spread by a load balancer) counts once.
--
-- KEYS[1]  leases: a sorted set, "instance|client|download" scored by when the lease lapses (ms)
-- KEYS[2]  holders: a hash, "client|download" -> the leases held on it
-- KEYS[3]  clients: a hash, client -> the downloads it has under way
-- ARGV[1]  "hold", "release" or "renew"
-- ARGV[2]  the lease's length in milliseconds
-- hold:    ARGV[3] the lease, ARGV[4] the per-client limit, ARGV[5] the per-route limit (0: none)
--          Returns "held", or the limit a new download would break: "per_client", "per_route".
-- release, renew: ARGV[3..] leases. Return nothing.
--
-- Time is the server's (TIME), so instances whose clocks differ agree on when a lease lapses.

local leases, holders, clients = KEYS[1], KEYS[2], KEYS[3]
local op, lease_ms = ARGV[1], tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- "instance|client|download" -> "client|download", "client" (an instance id and a client
-- address hold no "|").
local function parts(lease)
  local held = string.sub(lease, string.find(lease, '|', 1, true) + 1)
  return held, string.sub(held, 1, string.find(held, '|', 1, true) - 1)
end

local function drop(lease)
  if redis.call('ZREM', leases, lease) == 0 then
    return
  end
  local held, client = parts(lease)
  if redis.call('HINCRBY', holders, held, -1) <= 0 then
    redis.call('HDEL', holders, held)
    if redis.call('HINCRBY', clients, client, -1) <= 0 then
      redis.call('HDEL', clients, client)
    end
  end
end

-- Counts the lease (once: ZADD answers 1 only for a lease it did not have) and moves its end on.
local function add(lease)
  if redis.call('ZADD', leases, now + lease_ms, lease) == 1 then
    local held, client = parts(lease)
    if redis.call('HINCRBY', holders, held, 1) == 1 then
      redis.call('HINCRBY', clients, client, 1)
    end
  end
end

for _, lapsed in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, 256)) do
  drop(lapsed)
end

local answer = 'held'
if op == 'hold' then
  local lease, per_client, per_route = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  local held, client = parts(lease)
  -- A download already under way (here or on another instance) joins itself: no limit is asked.
  if redis.call('HEXISTS', holders, held) == 0 then
    if per_client > 0 and client ~= '' and tonumber(redis.call('HGET', clients, client) or '0') >= per_client then
      return 'per_client'
    end
    if per_route > 0 and redis.call('HLEN', holders) >= per_route then
      return 'per_route'
    end
  end
  add(lease)
elseif op == 'renew' then
  -- A lease that lapsed while its download went on (Redis unreachable for longer than a lease)
  -- counts again, unasked: the download is under way whatever the limit says now.
  for i = 3, #ARGV do
    add(ARGV[i])
  end
else
  for i = 3, #ARGV do
    drop(ARGV[i])
  end
end
-- The keys last as long as a lease could: a route nobody downloads from leaves nothing.
for _, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, 2 * lease_ms)
end
return answer
