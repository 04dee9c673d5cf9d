"""The Lua scripts of a shared pool whose line is `fair` (`queue_order: fair`).

The same steps as `policies.slots.lua` (whose header lists every key, KEYS[12..16] being
this line's own), with the rules of `policies.limits.fairness` applied inside them, so the share
is fair across every gateway process: among the waiters of one class, a freed slot goes
to the head of the tenant with the least weighted tokens served (ties: the earliest
arrival), first come, first served within a tenant; classes first. A tenant is a string
without '|' (the pool passes its UTF-8 in hex).

  - ENQUEUE lifts a tenant with nothing waiting to the least counter of those waiting
    (none: the counter of the tenant granted last), and forgets the lowest idle counters
    once more than `kept` are held, as `Counters.trim` does. ACQUIRE (a free slot, nobody
    waiting) charges its newcomer's prompt too.
  - POLL computes the first `free seats` of the fair order, each pick charged its expected
    tokens in a local copy of the counters (not in Redis), and grants the process's tickets
    among them; a grant charges its prompt / weight. Positions are places in that order,
    exact for the first `places` of a class; beyond, the FIFO rank (at least the class's
    first place beyond them).
  - RENEW and RELEASE charge the answer's tokens produced since the last charge / weight.
    A lease that expired (its process crashed) stops charging: its share is gone.

A POLL reads each waiting tenant's head (O(T log n), T tenants, n waiters), then a pick
costs O(log n): `free seats` picks to grant, up to `places` a class to place tickets. A
newcomer ahead of waiters of its class publishes `moved`: their places moved back.
"""

from __future__ import annotations

from policies.slots.lua import PRELUDE
from policies.slots.lua_tenants import TENANTS

FAIR_PLACES = 256  # places of a class placed exactly in POLL and ENQUEUE replies

# ACQUIRE: as in `policies.slots.lua`; the newcomer's tenant is charged its prompt.
#   ARGV[1] lease id   ARGV[2] ttl ms   ARGV[3] wake-up channel   ARGV[4] tenant ('': none,
#   charged nothing)   ARGV[5] weight   ARGV[6] prompt tokens   ARGV[7..] the replicas
FAIR_ACQUIRE = PRELUDE + TENANTS + """
local now = now_ms()
purge(now, ARGV[3], forget)
local s = state()
local replica = s[3] == 0 and free_seat(7, #ARGV)
if replica then
  local token = grant(ARGV[1], now, tonumber(ARGV[2]), replica)
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[13], ARGV[1],
               ARGV[5] .. '|' .. ARGV[6] .. '|' .. ARGV[6] .. '|' .. ARGV[4])
    redis.call('SET', KEYS[16], charge(share_of(ARGV[1]), tonumber(ARGV[6])))
  end
  s = changed(nil, ARGV[3])
  return {token, s[1], s[2], s[3], s[4], s[5], replica}
end
return {0, s[1], s[2], s[3], s[4], s[5], ''}
"""

# ENQUEUE: a place in its class's fair line, unless the line is full (shedding as FIFO).
#   ARGV[1] queue limit   ARGV[2] ticket id   ARGV[3] ttl ms   ARGV[4] wake-up channel
#   ARGV[5] class rank   ARGV[6] tenant   ARGV[7] weight   ARGV[8] prompt tokens
#   ARGV[9] expected tokens (prompt and answer)   ARGV[10] counters kept   ARGV[11] places
#   returns as FIFO's ENQUEUE, the position being its place in the fair order
FAIR_ENQUEUE = PRELUDE + TENANTS + """
local now = now_ms()
local id, ttl, rank, tenant = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[5]), ARGV[6]
local places = tonumber(ARGV[11])
purge(now, ARGV[4], forget)
local s = state()
local kind = nil
if s[3] >= tonumber(ARGV[1]) then
  if not shed_for(rank, now, ttl, unline) then
    return {0, s[1], s[2], s[3], s[4], s[5]}
  end
  kind = 'shed'
end
local tenants, counts = backlog()
local floor, waiting, mine = nil, {}, false
for r = 0, 2 do
  for _, t in ipairs(tenants[r]) do
    mine = mine or t == tenant
    if not waiting[t] then
      waiting[t] = true
      local c = counter(t)
      if floor == nil or c < floor then floor = c end
    end
  end
end
if not mine then  -- no credit for time idle
  floor = floor or tonumber(redis.call('GET', KEYS[16]) or '0')
  if counter(tenant) < floor then
    redis.call('HSET', KEYS[12], tenant, string.format('%.17g', floor))
  end
end
local seq = redis.call('INCR', KEYS[4])
redis.call('ZADD', KEYS[2], string.format('%.0f', rank * RANK + seq), id)
redis.call('ZADD', KEYS[3], now + ttl, id)
redis.call('HSET', KEYS[13], id, ARGV[7] .. '|' .. ARGV[8] .. '|' .. ARGV[9] .. '|' .. tenant)
redis.call('ZADD', KEYS[14], 0, member(rank, seq, tenant, id))
if redis.call('HINCRBY', KEYS[15], rank .. '|' .. tenant, 1) == 1 then
  table.insert(tenants[rank], tenant)
end
counts[rank] = counts[rank] + 1
trim(tonumber(ARGV[10]))
local before = 0
for r = 0, rank - 1 do before = before + counts[r] end
local picks = class_order(rank, tenants[rank], 0, {[id] = true}, 1, places)
local position = before + places + 1
for k, pick in ipairs(picks) do
  if pick == id then position = before + k end
end
if position > before + places then
  position = math.max(redis.call('ZRANK', KEYS[2], id) + 1, position)
elseif position < before + counts[rank] and not kind then
  kind = 'moved'  -- waiters of its class moved back
end
s = changed(kind, ARGV[4])
return {position, s[1], s[2], s[3], s[4], s[5]}
"""

# POLL: grant each of the process's tickets among the first `free seats` of the fair
# order (so every ticket ahead of it can be served too), charging its prompt; else refresh
# its heartbeat and report its place (less this call's grants, all of them ahead).
#   ARGV[1] ttl ms   ARGV[2] wake-up channel   ARGV[3] places   ARGV[4] n, the replicas
#   ARGV[5..4+2n] the replicas as name, slots pairs, in the order of preference
#   ARGV[5+2n..] ticket ids
#   returns as FIFO's POLL
FAIR_POLL = PRELUDE + TENANTS + """
local now = now_ms()
local ttl, places = tonumber(ARGV[1]), tonumber(ARGV[3])
local last = 4 + 2 * tonumber(ARGV[4])  -- the last ARGV of the replicas
purge(now, ARGV[2], forget)
local free = free_seats(5, last)
local tenants, counts = backlog()
local targets, left = {[0] = {}, {}, {}}, {[0] = 0, 0, 0}
local scores = {}
for i = last + 1, #ARGV do
  local score = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if score then
    local r = math.floor(tonumber(score) / RANK)
    scores[ARGV[i]] = r
    targets[r][ARGV[i]] = true
    left[r] = left[r] + 1
  end
end
local chosen, place, before = {}, {}, 0
for r = 0, 2 do
  local want = math.min(counts[r], math.max(0, free - before))
  if want > 0 or left[r] > 0 then
    for k, id in ipairs(class_order(r, tenants[r], want, targets[r], left[r], places)) do
      if k <= want then chosen[id] = true end
      if targets[r][id] and k <= places then place[id] = before + k end
    end
  end
  for id in pairs(targets[r]) do
    place[id] = place[id] or math.max(redis.call('ZRANK', KEYS[2], id) + 1, before + places + 1)
  end
  before = before + counts[r]
end
local out = {}
local grants = 0
for i = last + 1, #ARGV do
  local id = ARGV[i]
  if scores[id] and chosen[id] then
    local replica = free_seat(5, last)
    local share = unline(id, true)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    table.insert(out, 1)
    table.insert(out, grant(id, now, ttl, replica))
    table.insert(out, replica)
    if share then redis.call('SET', KEYS[16], charge(share, share.prompt)) end
    grants = grants + 1
  elseif scores[id] then
    redis.call('ZADD', KEYS[3], 'XX', now + ttl, id)
    table.insert(out, 0)
    table.insert(out, place[id])
    table.insert(out, '')
  else
    not_waiting(id, out)
  end
end
for i = 1, #out, 3 do
  if out[i] == 0 then out[i + 1] = out[i + 1] - grants end
end
return poll_reply(now, grants, ARGV[2], out)
"""

# RENEW: as FIFO's, and a held lease charges its answer's tokens since the last charge.
#   ARGV[1..5] as FIFO's RENEW   ARGV[6] tokens produced since the last charge
FAIR_RENEW = PRELUDE + TENANTS + """
local now = now_ms()
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  local share = share_of(ARGV[1])
  if share and tonumber(ARGV[6]) > 0 then charge(share, tonumber(ARGV[6])) end
  return 1
end
purge(now, ARGV[4], forget)
if held(ARGV[5]) < tonumber(ARGV[3]) then
  grant(ARGV[1], now, tonumber(ARGV[2]), ARGV[5])
  changed('grant', ARGV[4])
  return 2
end
return 0
"""

# RELEASE: as FIFO's, a held lease charging its answer's tokens since the last charge.
#   ARGV[1] lease id   ARGV[2] wake-up channel   ARGV[3] tokens since the last charge
FAIR_RELEASE = PRELUDE + TENANTS + """
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
local share = share_of(ARGV[1])
redis.call('HDEL', KEYS[13], ARGV[1])
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  unseat(ARGV[1])
  if share and tonumber(ARGV[3]) > 0 then charge(share, tonumber(ARGV[3])) end
  local s = changed('release', ARGV[2])
  return {1, s[1], s[2], s[3], s[4], s[5]}
end
local s = state()
return {0, s[1], s[2], s[3], s[4], s[5]}
"""

# WITHDRAW: as FIFO's, the waiter leaving the tenants' index too.
#   ARGV[1] ticket id   ARGV[2] wake-up channel
FAIR_WITHDRAW = PRELUDE + TENANTS + """
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  unline(ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  local s = changed('withdraw', ARGV[2])
  return {1, s[1], s[2], s[3], s[4], s[5]}
end
redis.call('ZREM', KEYS[9], ARGV[1])
local s = state()
return {0, s[1], s[2], s[3], s[4], s[5]}
"""
