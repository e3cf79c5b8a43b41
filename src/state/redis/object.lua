-- record(): notes the version an object was seen as. ObjectRecord::observe in model.rs is the same
-- rule in Rust.
--
-- KEYS[1]  the object record
-- ARGV[1]  the record as it is when the object is seen for the first time (JSON, format 1)
-- ARGV[2]  TTL in milliseconds
-- ARGV[3]  MAX_VERSIONS
-- Returns nothing.

local fresh, ttl_ms, max_versions = ARGV[1], ARGV[2], tonumber(ARGV[3])

-- The stored record having seen the new version, or nil when it is not a valid format-1 record
-- of this object.
local function merged(raw, seen)
  local s = cjson.decode(raw)
  if type(s) ~= 'table' or s.v ~= 1 or s.key ~= seen.key or not is_array(s.versions) then
    return nil
  end
  -- The new sighting goes first; the version it repeats, if any, keeps its first_seen.
  local sighting = seen.versions[1]
  local versions = { sighting }
  for _, entry in ipairs(s.versions) do
    if type(entry) ~= 'table' or not is_version(entry.version)
      or not is_count(entry.first_seen) or not is_count(entry.last_seen) then
      return nil
    end
    if same_version(entry.version, sighting.version) then
      sighting.first_seen = entry.first_seen
    elseif #versions < max_versions then
      versions[#versions + 1] = entry
    end
  end
  s.versions = versions
  s.current = seen.current
  s.seen_at = seen.seen_at
  return encode(s)
end

store(merged_or_fresh(merged, fresh), ttl_ms)
