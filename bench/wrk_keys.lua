-- wrk script shared by every HTTP target of the suite: one key header per request, drawn
-- uniformly from KEYS keys ("k0" .. "k9999" by default), so Levee and nginx see the same
-- request shape. Prints one JSON line of results at the end (parsed by bench/run.py).
--
--   wrk -t1 -c64 -d3s -s bench/wrk_keys.lua http://127.0.0.1:PORT/PATH -- [KEYS] [HEADER]

local keys = 10000
local header = "x-key"

function init(args)
  if args[1] then keys = tonumber(args[1]) end
  if args[2] then header = args[2] end
  math.randomseed(os.time() + (wrk.thread and tonumber(tostring(wrk.thread):match("0x(%x+)") or "0", 16) or 0))
end

function request()
  wrk.headers[header] = "k" .. math.random(0, keys - 1)
  return wrk.format()
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9), latency.max))
end
