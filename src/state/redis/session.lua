-- record(): adds one delivery to a download session, atomically (Redis runs one script at a time).
-- DownloadSession::record and VersionSent::add in model.rs are the same rules in Rust.
--
-- KEYS[1]  the session (one download id, one object)
-- ARGV[1]  the session as it is when it begins with this delivery (JSON, format 1, from Rust)
-- ARGV[2]  TTL in milliseconds
-- ARGV[3]  how the response ended: 'whole', 'cut' or 'parts'
-- ARGV[4]  start of the range delivered   ARGV[5] its end (exclusive)
-- ARGV[6]  body bytes sent                ARGV[7] now, Unix seconds
-- ARGV[8]  IntervalSet::MAX_INTERVALS     ARGV[9] MAX_SESSION_VERSIONS
-- ARGV[10] UNREAD_SLACK
-- Returns the session as stored (JSON).

local fresh, ttl_ms, ending = ARGV[1], ARGV[2], ARGV[3]
local first, last = tonumber(ARGV[4]), tonumber(ARGV[5])
local bytes, now, max_intervals = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local max_versions, slack = tonumber(ARGV[9]), tonumber(ARGV[10])

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

local function is_version_sent(v)
  return type(v) == 'table' and is_version(v.version)
    and is_intervals(v.sent) and is_intervals(v.ends)
    and type(v.partial) == 'boolean' and type(v.overflowed) == 'boolean'
end

-- IntervalSet::insert: merges what overlaps or touches [a, b); refuses (returns `list` as it was,
-- and false) when that would take more than max_intervals intervals.
local function insert(list, a, b)
  if a >= b then
    return list, true
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
    return list, false
  end
  return out, true
end

-- VersionSent::add.
local function add_range(sent)
  local whole_version = ending == 'whole' and first == 0 and last >= sent.version.size
  if not whole_version then
    sent.partial = true
  end
  if ending == 'parts' then
    return
  end
  local ends_from = first
  if ending == 'whole' then
    ends_from = math.max(first, last - slack - 1)
  end
  local added, ended
  sent.sent, added = insert(sent.sent, first, last)
  sent.ends, ended = insert(sent.ends, ends_from, last)
  if not (added and ended) then
    sent.overflowed = true
  end
end

-- The session after the delivery: the stored one with the delivery added to its version's
-- record (DownloadSession::add), or nil when a new session begins (another download under a
-- colliding key, or not a valid format-1 session).
local function merged(raw, delivery)
  local s = cjson.decode(raw)
  if type(s) ~= 'table' or s.v ~= 1 or s.id ~= delivery.id or s.object ~= delivery.object
    or type(s.object) ~= 'string' or type(s.route) ~= 'string' or type(s.client) ~= 'string'
    or not is_array(s.versions) or #s.versions > max_versions or type(s.forgot) ~= 'boolean'
    or not is_count(s.bytes) or not is_count(s.started_at) or not is_count(s.updated_at) then
    return nil
  end
  for _, sent in ipairs(s.versions) do
    if not is_version_sent(sent) then
      return nil
    end
  end
  local version = delivery.versions[1].version
  local sent = nil
  for i, candidate in ipairs(s.versions) do
    if same_version(candidate.version, version) then
      sent = table.remove(s.versions, i)
      break
    end
  end
  if sent == nil then
    sent = { sent = {}, ends = {}, partial = false, overflowed = false }
  end
  -- The same bytes may come with a new description (content type, strength).
  sent.version = version
  add_range(sent)
  table.insert(s.versions, 1, sent)
  if #s.versions > max_versions then
    s.versions[#s.versions] = nil
    s.forgot = true
  end
  s.route, s.client = delivery.route, delivery.client
  s.bytes = math.min(s.bytes + bytes, MAX_EXACT)
  s.updated_at = now
  return encode(s)
end

return store(merged_or_fresh(merged, fresh), ttl_ms)
