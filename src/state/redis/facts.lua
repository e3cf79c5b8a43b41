-- learn(): adds what a stage learned about an object version. facts.rs's merge_fields is the same
-- rule in Rust.
--
-- KEYS[1]  the facts hash
-- ARGV[1]  the version the facts are about
-- ARGV[2]  TTL in milliseconds
-- ARGV[3]  the most fields the hash may hold (MAX_FIELDS)
-- ARGV[4..] field, value, field, value, ...
-- Returns nothing.

local key, version, ttl_ms, max_fields = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])

-- Facts about another version are dropped whole: a digest of one ETag is never shown for another.
if redis.call('HGET', key, 'v') ~= version then
  redis.call('DEL', key)
  redis.call('HSET', key, 'v', version)
end
for i = 4, #ARGV - 1, 2 do
  if redis.call('HLEN', key) > max_fields and redis.call('HEXISTS', key, ARGV[i]) == 0 then
    break
  end
  redis.call('HSET', key, ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', key, ttl_ms)
