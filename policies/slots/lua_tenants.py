"""The Lua helpers of a `fair` shared line's scripts (`policies.slots.lua_fair`), run
after `policies.slots.lua`'s PRELUDE: the tenants' counters (KEYS[12]), each ticket's or
lease's share (KEYS[13]), the tenants' index of the waiters (KEYS[14], KEYS[15]) and the
fair order of one class (`policies.limits.fairness.order`), pick by pick: a binary heap of the
waiting tenants' heads, the least counter first (ties: the earliest arrival), each pick
charged its expected tokens in the heap, not in Redis; the head after a pick is one
ZRANGEBYLEX on the index, O(log n).
"""

from __future__ import annotations

TENANTS = """
local RANK = 1e13  -- a class's span of the waiters' scores

local function share_of(id)
  local s = redis.call('HGET', KEYS[13], id)
  if not s then return nil end
  local w, p, e, t = string.match(s, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
  return {weight = tonumber(w), prompt = tonumber(p), expected = tonumber(e), tenant = t}
end

local function counter(tenant)
  return tonumber(redis.call('HGET', KEYS[12], tenant) or '0')
end

local function charge(share, tokens)
  return redis.call('HINCRBYFLOAT', KEYS[12], share.tenant,
                    string.format('%.17g', tokens / share.weight))
end

local function member(rank, seq, tenant, id)
  return string.format('%d|%s|%013.0f|%s', rank, tenant, seq, id)
end

-- a waiter leaves the tenants' index (before it leaves KEYS[2]); returns its share
local function unline(id, keep_share)
  local score = redis.call('ZSCORE', KEYS[2], id)
  local share = share_of(id)
  if score and share then
    score = tonumber(score)
    local rank = math.floor(score / RANK)
    redis.call('ZREM', KEYS[14], member(rank, score - rank * RANK, share.tenant, id))
    local field = rank .. '|' .. share.tenant
    if redis.call('HINCRBY', KEYS[15], field, -1) <= 0 then redis.call('HDEL', KEYS[15], field) end
  end
  if not keep_share then redis.call('HDEL', KEYS[13], id) end
  return share
end

-- purge's hook: an expired lease stops charging, a dead waiter leaves the index
local function forget(id, waiting)
  if waiting then unline(id) else redis.call('HDEL', KEYS[13], id) end
end

-- the tenants waiting in each class (0..2) and each class's waiters
local function backlog()
  local flat = redis.call('HGETALL', KEYS[15])
  local tenants, counts = {[0] = {}, {}, {}}, {[0] = 0, 0, 0}
  for i = 1, #flat, 2 do
    local r, t = string.match(flat[i], '^(%d+)|(.*)$')
    r = tonumber(r)
    table.insert(tenants[r], t)
    counts[r] = counts[r] + tonumber(flat[i + 1])
  end
  return tenants, counts
end

-- a binary heap of {counter, seq, tenant, member, id}: the least counter, then seq
local function less(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  return a[2] < b[2]
end

local function push(h, x)
  table.insert(h, x)
  local i = #h
  while i > 1 do
    local p = math.floor(i / 2)
    if not less(h[i], h[p]) then break end
    h[i], h[p] = h[p], h[i]
    i = p
  end
end

local function pop(h)
  local top, tail = h[1], table.remove(h)
  if #h > 0 then
    h[1] = tail
    local i = 1
    while true do
      local l, m = 2 * i, i
      if l <= #h and less(h[l], h[m]) then m = l end
      if l + 1 <= #h and less(h[l + 1], h[m]) then m = l + 1 end
      if m == i then break end
      h[i], h[m] = h[m], h[i]
      i = m
    end
  end
  return top
end

-- tenant's first waiter of class `rank` after `after` (nil: its first), as a heap entry
local function head(rank, tenant, after, at)
  local prefix = rank .. '|' .. tenant .. '|'
  local m = redis.call('ZRANGEBYLEX', KEYS[14], after and ('(' .. after) or ('[' .. prefix),
                       '[' .. prefix .. '\\255', 'LIMIT', 0, 1)[1]
  if not m then return nil end
  local seq, id = string.match(m, '^%d+|[^|]*|(%d+)|(.*)$')
  return {at, tonumber(seq), tenant, m, id}
end

-- class `rank`'s fair order (policies.limits.fairness.order): the ids picked until `want` are
-- picked and the `left` ids of `targets` are placed, or `places` are picked
local function class_order(rank, tenants, want, targets, left, places)
  local heap = {}
  for _, t in ipairs(tenants) do
    local first = head(rank, t, nil, counter(t))
    if first then push(heap, first) end
  end
  local picks = {}
  while #heap > 0 and (#picks < want or (left > 0 and #picks < places)) do
    local top = pop(heap)
    table.insert(picks, top[5])
    if targets[top[5]] then left = left - 1 end
    local share = share_of(top[5])
    local cost = share and share.expected / share.weight or 0
    local after = head(rank, top[3], top[4], top[1] + cost)
    if after then push(heap, after) end
  end
  return picks
end

-- at most `kept` counters: once over, the lowest idle ones go, and an eighth more
local function trim(kept)
  local n = redis.call('HLEN', KEYS[12])
  if n <= kept then return end
  local busy = {}
  for _, f in ipairs(redis.call('HKEYS', KEYS[15])) do
    busy[string.match(f, '^%d+|(.*)$')] = true
  end
  for _, v in ipairs(redis.call('HVALS', KEYS[13])) do
    busy[string.match(v, '^[^|]*|[^|]*|[^|]*|(.*)$')] = true
  end
  local flat = redis.call('HGETALL', KEYS[12])
  local idle = {}
  for i = 1, #flat, 2 do
    if not busy[flat[i]] then table.insert(idle, {tonumber(flat[i + 1]), flat[i]}) end
  end
  table.sort(idle, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  for i = 1, math.min(n - kept + math.floor(kept / 8), #idle) do
    redis.call('HDEL', KEYS[12], idle[i][2])
  end
end
"""
