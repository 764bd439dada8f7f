-- wrk script: HTTP/1.1 pipelining, DEPTH requests per write (wrk's pipeline example pattern).
-- Each response still counts as one request in wrk's totals; latency is per batch of DEPTH.
--   wrk -s bench/pipeline.lua http://127.0.0.1:8080/hello
-- Environment: PIPELINE_DEPTH (default 16).

local depth = tonumber(os.getenv("PIPELINE_DEPTH") or "16")

init = function(args)
  local r = {}
  for i = 1, depth do
    r[i] = wrk.format(nil, wrk.path)
  end
  req = table.concat(r)
end

request = function()
  return req
end
