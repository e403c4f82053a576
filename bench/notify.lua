-- wrk script for bench/run.sh: replays pre-forged notify requests (`paynotify forge`), each
-- exactly once. The file at $BENCH_REQUESTS holds raw HTTP/1.1 requests, each after a line
-- with its length in bytes; wrk thread k of $BENCH_THREADS takes requests k, k+T, k+2T, …
-- and stops when every one of them was answered. A connection whose share is used up sends
-- GET /healthz until its thread stops (at most one per connection; not counted below).
-- Throughput is counted from the first request to the last answer, whichever thread.
--
-- With $BENCH_RATE (requests per second, all threads together) requests are sent on a
-- schedule at that rate instead of as fast as answers come back (the soak uses it).
--
-- Prints one line for run.sh:
--   RESULT answered=… ok=… errors=… statuses=… duration_us=… p50_us=… p99_us=… p999_us=…
-- statuses counts the answers other than 200/204 by status, e.g. 401x12,404x3 (- for none).

local ffi = require("ffi")
ffi.cdef [[
   typedef struct { long tv_sec; long tv_usec; } bench_timeval;
   int gettimeofday(bench_timeval *tv, void *tz);
]]

local function now_us()
   local tv = ffi.new("bench_timeval")
   ffi.C.gettimeofday(tv, nil)
   return tonumber(tv.tv_sec) * 1000000 + tonumber(tv.tv_usec)
end

local threads = {}
local next_id = 0

function setup(thread)
   next_id = next_id + 1
   thread:set("id", next_id)
   table.insert(threads, thread)
end

function init(args)
   local path = os.getenv("BENCH_REQUESTS")
   local nthreads = tonumber(os.getenv("BENCH_THREADS"))
   mine = {}
   local f = assert(io.open(path, "rb"))
   local i = 0
   while true do
      local line = f:read("*l")
      if not line then break end
      local request = f:read(tonumber(line))
      if i % nthreads == id - 1 then
         mine[#mine + 1] = request
      end
      i = i + 1
   end
   f:close()
   expected = #mine
   idle = wrk.format("GET", "/healthz")
   if id == 1 then
      -- wrk calls request() once on the first thread to check it, and drops that request.
      table.insert(mine, 1, idle)
   end
   cursor = 1
   first_us = 0
   last_us = 0
   answered = 0
   ok = 0
   errors = 0
   counts = {}
   statuses = ""
   local rate = tonumber(os.getenv("BENCH_RATE") or "")
   if rate then
      interval_us = nthreads * 1000000 / rate
   end
   next_us = 0
end

if os.getenv("BENCH_RATE") then
   -- Each thread sends its share on a fixed schedule: the request waits for its slot.
   function delay()
      local now = now_us()
      if next_us < now then
         next_us = now
      end
      local wait_ms = math.floor((next_us - now) / 1000)
      next_us = next_us + interval_us
      return wait_ms
   end
end

function request()
   local r = mine[cursor]
   if first_us == 0 then
      first_us = now_us()
   end
   if r then
      cursor = cursor + 1
      return r
   end
   return idle
end

function response(status, headers, body)
   -- WeChat Pay answers success with 204, Alipay with 200 "success"; /healthz is 200 JSON.
   if status == 200 and body ~= "success" then
      return
   end
   answered = answered + 1
   if status == 204 or status == 200 then
      ok = ok + 1
   else
      errors = errors + 1
      counts[status] = (counts[status] or 0) + 1
      local parts = {}
      for code, n in pairs(counts) do
         parts[#parts + 1] = code .. "x" .. n
      end
      statuses = table.concat(parts, " ") .. " "
   end
   if answered >= expected then
      last_us = now_us()
      -- wrk's main thread sleeps for -d whatever happens: run.sh interrupts it (SIGINT)
      -- once every thread has left its file here.
      local f = io.open(os.getenv("BENCH_DONE") .. "." .. id, "w")
      if f then f:close() end
      wrk.thread:stop()
   end
end

function done(summary, latency, requests)
   local answered, ok, errors, statuses = 0, 0, 0, ""
   local first, last = math.huge, 0
   for _, t in ipairs(threads) do
      local f, l = t:get("first_us"), t:get("last_us")
      if f > 0 and f < first then first = f end
      if l == 0 then l = now_us() end -- did not finish: until now
      if l > last then last = l end
      answered = answered + t:get("answered")
      ok = ok + t:get("ok")
      errors = errors + t:get("errors")
      statuses = statuses .. t:get("statuses")
   end
   if statuses == "" then statuses = "-" end
   io.write(string.format(
      "RESULT answered=%d ok=%d errors=%d statuses=%s duration_us=%d p50_us=%d p99_us=%d p999_us=%d timeouts=%d\n",
      answered, ok, errors, (statuses:gsub(" ", ",")), last - first,
      latency:percentile(50), latency:percentile(99), latency:percentile(99.9),
      summary.errors.timeout))
end
