-- wrk script for benches/load/run.sh.
--
-- Always: done() prints one machine-readable line (WRK key=value ...) with the totals, latency
-- percentiles and errors, so run.sh needs no parsing of wrk's human summary.
--
-- With RANGE_OBJECT_BYTES and RANGE_SPAN_BYTES in the environment (the resume workload): every
-- request asks for a fresh random `Range: bytes=a-b` of RANGE_SPAN_BYTES inside the object, as
-- resuming clients and parallel downloaders do. Without them, request() is left undefined, so wrk
-- sends its one precomputed request (the cheapest path: the generator stays out of the way).

local object = tonumber(os.getenv("RANGE_OBJECT_BYTES") or "")
local span = tonumber(os.getenv("RANGE_SPAN_BYTES") or "")

local counter = 0
function setup(thread)
  -- Each wrk thread has its own Lua state; give each its own random sequence.
  counter = counter + 1
  thread:set("seed", counter)
end

function init(args)
  math.randomseed(os.time() * 1000 + (seed or 0))
end

if object and span then
  local last_start = object - span
  function request()
    local a = math.random(0, last_start)
    wrk.headers["Range"] = "bytes=" .. a .. "-" .. (a + span - 1)
    return wrk.format()
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK requests=%d bytes=%d duration_us=%d p50_us=%d p99_us=%d max_us=%d " ..
    "status_errors=%d connect_errors=%d read_errors=%d write_errors=%d timeouts=%d\n",
    summary.requests, summary.bytes, summary.duration,
    latency:percentile(50), latency:percentile(99), latency.max,
    e.status, e.connect, e.read, e.write, e.timeout))
end
