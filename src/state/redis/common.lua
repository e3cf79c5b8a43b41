-- Shared by rangeway's scripts (prepended to each): checks of stored values, and a JSON encoder.
-- The rules mirror src/state/model.rs and interval.rs; the contract suite holds them together.

-- 2^53, model.rs's MAX_EXACT: Lua numbers are doubles, exact up to here and no further.
local MAX_EXACT = 9007199254740992

local function is_count(x)
  return type(x) == 'number' and x >= 0 and x <= MAX_EXACT and x == math.floor(x)
end

local function is_text_or_null(x)
  return x == cjson.null or type(x) == 'string'
end

local function is_count_or_null(x)
  return x == cjson.null or is_count(x)
end

-- Whether `t` is a Lua array: keys exactly 1..#t. (cjson decodes both [] and {} to an empty table.)
local function is_array(t)
  if type(t) ~= 'table' then
    return false
  end
  local n = 0
  for _ in pairs(t) do
    n = n + 1
  end
  return n == #t
end

local function is_version(v)
  return type(v) == 'table'
    and is_text_or_null(v.etag)
    and type(v.strong) == 'boolean'
    and is_count(v.size)
    and is_count_or_null(v.last_modified)
    and is_text_or_null(v.content_type)
end

-- ObjectVersion::same_as: the same ETag, size and Last-Modified.
local function same_version(a, b)
  return a.etag == b.etag and a.size == b.size and a.last_modified == b.last_modified
end

-- cjson.encode writes numbers with 14 significant digits, which would round sizes and offsets past
-- 10^14: this encoder writes integers with all their digits. Tables are encoded as arrays when
-- their keys are 1..n (an empty table as []: no record has an empty object), else as objects.
local function encode(value)
  local t = type(value)
  if t == 'string' then
    return cjson.encode(value)
  elseif t == 'boolean' then
    return value and 'true' or 'false'
  elseif value == cjson.null then
    return 'null'
  elseif t == 'number' then
    if value == 0 then
      return '0' -- never "-0"
    elseif value == math.floor(value) and math.abs(value) <= MAX_EXACT then
      return string.format('%.0f', value)
    end
    return cjson.encode(value)
  elseif t ~= 'table' then
    error('cannot encode a ' .. t)
  end
  local parts = {}
  if is_array(value) then
    for i = 1, #value do
      parts[i] = encode(value[i])
    end
    return '[' .. table.concat(parts, ',') .. ']'
  end
  for k, v in pairs(value) do
    if type(k) ~= 'string' then
      error('a table with both array and object keys')
    end
    parts[#parts + 1] = cjson.encode(k) .. ':' .. encode(v)
  end
  return '{' .. table.concat(parts, ',') .. '}'
end

-- Writes `value` under KEYS[1] with the TTL, and returns it.
local function store(value, ttl_ms)
  redis.call('SET', KEYS[1], value, 'PX', ttl_ms)
  return value
end

-- The string stored under KEYS[1], or nil: a missing key, or one holding another type (whose
-- error reply redis.pcall returns as a table), is no record.
local function stored_string()
  local raw = redis.pcall('GET', KEYS[1])
  if type(raw) == 'string' then
    return raw
  end
  return nil
end

-- What KEYS[1] should hold next: `merge(stored, decoded fresh)` when something is stored and the
-- merge accepts it (returns a string, without raising), else `fresh` — the value as it is when
-- nothing usable was stored.
local function merged_or_fresh(merge, fresh)
  local raw = stored_string()
  if raw then
    local ok, merged = pcall(merge, raw, cjson.decode(fresh))
    if ok and merged then
      return merged
    end
  end
  return fresh
end
