-- lua5.1 argocd_run_health.lua HEALTH_LUA < OBJECT_JSON: runs an Argo CD health check the way
-- Argo CD's util/lua does and prints {"status": ..., "message": ...} as JSON.
-- As there: the object is the global `obj`, JSON null is nil (Argo CD's conversion drops it;
-- dkjson's nil option, not lua-cjson's truthy cjson.null), and only the base functions, `table`
-- and a safe part of `os` are loaded (useOpenLibs unset): no `string`, no `io`, no string
-- methods. The script's globals stay in its own environment.
local json = require("dkjson")
local script = assert(arg[1], "usage: lua5.1 argocd_run_health.lua HEALTH_LUA < OBJECT_JSON")
local object, _, err = json.decode(io.read("*a"), 1, nil)
if err then
  io.stderr:write("bad JSON: " .. err .. "\n")
  os.exit(2)
end
local chunk = assert(loadfile(script))

local env = { obj = object, table = table, os = { time = os.time, date = os.date,
  clock = os.clock, difftime = os.difftime }, _VERSION = _VERSION }
for _, name in ipairs({ "assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall",
    "print", "rawequal", "rawget", "rawset", "select", "setmetatable", "tonumber", "tostring",
    "type", "unpack", "xpcall" }) do
  env[name] = _G[name]
end
env._G = env
setfenv(chunk, env)
-- gopher-lua without the string library gives strings no methods: neither do we, while it runs.
local string_meta = getmetatable("")
local string_index = string_meta.__index
string_meta.__index = nil
local ok, hs = pcall(chunk)
string_meta.__index = string_index

if not ok then
  io.stderr:write("health script failed: " .. tostring(hs) .. "\n")
  os.exit(1)
end
if type(hs) ~= "table" then
  io.stderr:write("health script returned " .. type(hs) .. ", not a table\n")
  os.exit(1)
end
print(json.encode({ status = hs.status, message = hs.message }))
