-- record(): adds one delivery to a download session, atomically (Redis runs one script at a time).
-- DownloadSession::record in model.rs is the same rule in Rust.
--
-- KEYS[1]  the session
-- ARGV[1]  the session as it is when it begins with this delivery (JSON, format 1, from Rust)
-- ARGV[2]  TTL in milliseconds
-- ARGV[3]  '1' when the delivery covers the whole of its version
-- ARGV[4]  start of the range delivered   ARGV[5] its end (exclusive)
-- ARGV[6]  body bytes sent                ARGV[7] now, Unix seconds
-- ARGV[8]  IntervalSet::MAX_INTERVALS
-- Returns the session as stored (JSON).

local fresh, ttl_ms, whole = ARGV[1], ARGV[2], ARGV[3] == '1'
local first, last = tonumber(ARGV[4]), tonumber(ARGV[5])
local bytes, now, max_intervals = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])

local function is_intervals(list)
  if not is_array(list) or #list > max_intervals then
    return false
  end
  local previous_end = -1
  for _, r in ipairs(list) do
    if not is_array(r) or #r ~= 2 or not is_count(r[1]) or not is_count(r[2])
      or r[1] <= previous_end or r[1] >= r[2] then
      return false
    end
    previous_end = r[2]
  end
  return true
end

-- IntervalSet::insert: merges what overlaps or touches [a, b); refuses (returns `list` as it was)
-- when that would take more than max_intervals intervals.
local function insert(list, a, b)
  if a >= b then
    return list
  end
  local out, placed = {}, false
  for _, r in ipairs(list) do
    if r[2] < a then
      out[#out + 1] = r
    elseif b < r[1] then
      if not placed then
        out[#out + 1] = { a, b }
        placed = true
      end
      out[#out + 1] = r
    else
      a, b = math.min(a, r[1]), math.max(b, r[2])
    end
  end
  if not placed then
    out[#out + 1] = { a, b }
  end
  if #out > max_intervals then
    return list
  end
  return out
end

-- The session after the delivery: the stored one with the delivery added; the stored one as it
-- is when the delivery is a piece of another version while the stored download is unfinished
-- (DownloadSession::record says why); or nil when a new session begins (another download under a
-- colliding key, a finished download or a whole delivery of another version, or not a valid
-- format-1 session).
local function merged(raw, delivery)
  local s = cjson.decode(raw)
  if type(s) ~= 'table' or s.v ~= 1 or s.id ~= delivery.id or s.object ~= delivery.object
    or type(s.object) ~= 'string' or type(s.route) ~= 'string' or type(s.client) ~= 'string'
    or not is_version(s.version)
    or not is_intervals(s.delivered) or not is_count(s.bytes)
    or not is_count(s.started_at) or not is_count(s.updated_at)
    or type(s.complete) ~= 'boolean' then
    return nil
  end
  if not same_version(s.version, delivery.version) then
    if s.complete or whole then
      return nil
    end
    return raw
  end
  s.delivered = insert(s.delivered, first, last)
  s.bytes = math.min(s.bytes + bytes, MAX_EXACT)
  s.updated_at = now
  local size, head = s.version.size, s.delivered[1]
  s.complete = size == 0 or (head ~= nil and head[1] == 0 and head[2] >= size)
  return encode(s)
end

return store(merged_or_fresh(merged, fresh), ttl_ms)
