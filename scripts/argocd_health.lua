-- apportion's health check for Argo CD, the same for the three kinds (scripts/argocd_health.py
-- writes it into manifests/argocd/ once per kind); the rules are in docs/gitops.md.
-- Argo CD runs it in gopher-lua (Lua 5.1) with the object as the global `obj` and without the
-- standard libraries: only the base functions, `table` and part of `os` (no `string`).
local function find(conditions, kind)
  for _, condition in ipairs(conditions or {}) do
    if condition.type == kind then
      return condition
    end
  end
  return nil
end

local function says(condition)
  local text = condition.reason or condition.type
  if condition.message ~= nil and condition.message ~= "" then
    text = text .. ": " .. condition.message
  end
  return text
end

local function verdict(state, condition)
  return { status = state, message = says(condition) }
end

local status = obj.status
local generation = obj.metadata.generation
if status == nil or status.observedGeneration == nil
    or (generation ~= nil and status.observedGeneration < generation) then
  return {
    status = "Progressing",
    message = "waiting for the operator to observe generation " .. tostring(generation),
  }
end

local conditions = status.conditions
local stalled = find(conditions, "Stalled")
local reconciling = find(conditions, "Reconciling")
local ready = find(conditions, "Ready")
local degraded = find(conditions, "Degraded")

-- kstatus: Stalled=True is Failed, Reconciling=True is InProgress, whatever Ready says.
if stalled ~= nil and stalled.status == "True" then
  return verdict("Degraded", stalled)
end
if reconciling ~= nil and reconciling.status == "True" then
  return verdict("Progressing", reconciling)
end

if ready ~= nil and ready.status == "True" then
  local hs = verdict("Healthy", ready)
  if degraded ~= nil and degraded.status == "True" then
    hs.message = hs.message .. " (degraded: " .. says(degraded) .. ")"
  end
  return hs
end

-- An operator that sets Stalled and Reconciling says with Stalled when only a user can help;
-- one that predates them (neither condition present) said it with Degraded beside Ready=False.
local old = stalled == nil and reconciling == nil
if old and degraded ~= nil and degraded.status == "True" then
  return verdict("Degraded", degraded)
end
if ready ~= nil then
  return verdict("Progressing", ready)
end
return { status = "Progressing", message = "waiting for the operator to report Ready" }
