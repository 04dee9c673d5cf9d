"""The Lua scripts behind the shared per-key limits (`policies.slots.limits`): each step
(reserve, renew, settle, seed) is one atomic script mirroring `policies.limits.model`.

Every script works on the keys of one client key, which share a hash tag
(`{prefix:limits:<key id>}`, Redis Cluster safe), in this order:

    KEYS[1]  book   hash        rt, rc: tokens and cost reserved by the live holds;
                                rpm_l, rpm_at, tpm_l, tpm_at: each bucket's level and the
                                time (ms) it was set (absent: full);
                                <period>_s, <period>_t, <period>_c: a budget period's start
                                (ms) and the tokens and cost spent in it
    KEYS[2]  holds  sorted set  hold id -> expiry (ms, Redis clock)
    KEYS[3]  held   hash        hold id -> "tokens cost" it reserved
    KEYS[4]  gone   sorted set  hold id -> until (ms): released before its RESERVE ran

The limits come with every call (a reload applies at once; Redis keeps no config), as the
tail of ARGV from index `i`:

    ARGV[i]    max_concurrent   ARGV[i+1] rpm   ARGV[i+2] tpm   (0: none)
    ARGV[i+3]  n budgets, then n x (period, tokens, cost)       (0: none)

Time is Redis's own (`TIME`). Every script first drops the expired holds (a crashed
process's), giving back what they reserved. Numbers are kept with 17 significant digits,
so a bucket's level reads back as the double it was.
"""

from __future__ import annotations

KEY_NAMES = ("book", "holds", "held", "gone")
REFUSALS = ("max_concurrent", "budget", "rpm", "tpm")  # RESERVE's codes 1..4
IDLE_TTL_MS = 35 * 86_400_000  # an idle key's book outlives its longest (month) period

PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function num(field, default)
  local v = redis.call('HGET', KEYS[1], field)
  if v then return tonumber(v) end
  return default
end

local function put(field, value)
  redis.call('HSET', KEYS[1], field, string.format('%.17g', value))
end

-- days since 1970-01-01 <-> civil (year, month, day), proleptic Gregorian, UTC
local function civil(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
                          - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end

local function days(y, m)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100)
              + math.floor((153 * mp + 2) / 5)
  return era * 146097 + doe - 719468
end

-- the start and end (ms) of the UTC period holding `now`
local function bounds(period, now)
  if period == 'hour' then
    local s = math.floor(now / 3600000) * 3600000
    return s, s + 3600000
  end
  if period == 'day' then
    local s = math.floor(now / 86400000) * 86400000
    return s, s + 86400000
  end
  local y, m = civil(math.floor(now / 86400000))
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  return days(y, m) * 86400000, days(ny, nm) * 86400000
end

local function level(name, capacity, now)
  local l = num(name .. '_l', nil)
  if l == nil then return capacity end
  return math.min(capacity, l + (now - num(name .. '_at', now)) * capacity / 60000)
end

local function drop(id)
  local held = redis.call('HGET', KEYS[3], id)
  if not held then return 0 end
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[2], id)
  if redis.call('ZCARD', KEYS[2]) == 0 then
    put('rt', 0)
    put('rc', 0)
  else
    local tokens, cost = string.match(held, '(%S+) (%S+)')
    put('rt', num('rt', 0) - tonumber(tokens))
    put('rc', num('rc', 0) - tonumber(cost))
  end
  return 1
end

local function purge(now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
    drop(id)
  end
end

-- the limits from ARGV[i]
local function limits(i)
  local l = {cap = tonumber(ARGV[i]), rpm = tonumber(ARGV[i + 1]),
             tpm = tonumber(ARGV[i + 2]), budgets = {}}
  for b = 0, tonumber(ARGV[i + 3]) - 1 do
    local at = i + 4 + b * 3
    table.insert(l.budgets, {ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])})
  end
  return l
end

local function touched()
  redis.call('PEXPIRE', KEYS[1], IDLE_TTL)
end
""".replace("IDLE_TTL", str(IDLE_TTL_MS))

# RESERVE: admit a request and reserve its estimate, or refuse it changing nothing.
# Checked in order: concurrency, budgets (spent + reserved < limit), rpm, tpm (above 0).
#   ARGV[1] hold id   ARGV[2] ttl ms   ARGV[3] estimated tokens   ARGV[4] estimated cost
#   ARGV[5..] the limits
#   returns {0, 0, 0, now} admitted, or {code (REFUSALS[code - 1]), retry ms, the refusing
#   budget's index (1-based; else 0), now}
RESERVE = PRELUDE + """
local now = now_ms()
purge(now)
if redis.call('ZSCORE', KEYS[4], ARGV[1]) then return {0, 0, 0, now} end  -- given up
local l = limits(5)
if l.cap > 0 and redis.call('ZCARD', KEYS[2]) >= l.cap then return {1, 1000, 0, now} end
local rt, rc = num('rt', 0), num('rc', 0)
for i, b in ipairs(l.budgets) do
  local s, e = bounds(b[1], now)
  local t, c = 0, 0
  if num(b[1] .. '_s', -1) == s then t, c = num(b[1] .. '_t', 0), num(b[1] .. '_c', 0) end
  if (b[2] > 0 and t + rt >= b[2]) or (b[3] > 0 and c + rc >= b[3]) then
    return {2, e - now, i, now}
  end
end
local rpm, tpm = 0, 0
if l.rpm > 0 then
  rpm = level('rpm', l.rpm, now)
  if rpm <= 0 then return {3, math.floor(-rpm * 60000 / l.rpm) + 1, 0, now} end
end
if l.tpm > 0 then
  tpm = level('tpm', l.tpm, now)
  if tpm <= 0 then return {4, math.floor(-tpm * 60000 / l.tpm) + 1, 0, now} end
end
if l.rpm > 0 then
  put('rpm_l', rpm - 1)
  put('rpm_at', now)
end
if l.tpm > 0 then
  put('tpm_l', tpm - tonumber(ARGV[3]))
  put('tpm_at', now)
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3] .. ' ' .. ARGV[4])
put('rt', rt + tonumber(ARGV[3]))
put('rc', rc + tonumber(ARGV[4]))
touched()
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + 1000)
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[2]) + 1000)
return {0, 0, 0, now}
"""

# RENEW: extend a process's live holds of this key (one call per key per heartbeat).
#   ARGV[1] ttl ms   ARGV[2..] hold ids
#   returns the ids no longer held (expired, or settled meanwhile)
RENEW = PRELUDE + """
local now = now_ms()
purge(now)
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[2], ARGV[i]) then
    redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[1]), ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[1]) + 1000)
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[1]) + 1000)
return lost
"""

# SETTLE: a request ended (idempotent for its hold: a second call charges again, so the
# caller settles once): its hold is given back, tpm gets estimate - used back, and each
# budget period is charged what it used. A lost hold's use is charged all the same.
#   ARGV[1] hold id   ARGV[2] estimated tokens   ARGV[3] tokens used   ARGV[4] cost
#   ARGV[5..] the limits
#   returns {1 held or 0 lost, now}
SETTLE = PRELUDE + """
local now = now_ms()
purge(now)
local held = drop(ARGV[1])
local l = limits(5)
if l.tpm > 0 then
  put('tpm_l', math.min(l.tpm, level('tpm', l.tpm, now)
                                + (tonumber(ARGV[2]) - tonumber(ARGV[3]))))
  put('tpm_at', now)
end
local seen = {}
for _, b in ipairs(l.budgets) do
  local p = b[1]
  if not seen[p] then
    seen[p] = true
    local s = bounds(p, now)
    if num(p .. '_s', -1) ~= s then
      put(p .. '_s', s)
      put(p .. '_t', 0)
      put(p .. '_c', 0)
    end
    put(p .. '_t', num(p .. '_t', 0) + tonumber(ARGV[3]))
    put(p .. '_c', num(p .. '_c', 0) + tonumber(ARGV[4]))
  end
end
touched()
return {held, now}
"""

# RELEASE: give back the holds of calls whose outcome is unknown (a RESERVE or SETTLE that
# failed or timed out): each is dropped if held, else remembered until the TTL has passed
# so that its RESERVE, arriving late, changes nothing. Idempotent.
#   ARGV[1] ttl ms   ARGV[2..] hold ids
#   returns how many were held
RELEASE = PRELUDE + """
local now = now_ms()
purge(now)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local n = 0
for i = 2, #ARGV do
  if drop(ARGV[i]) == 1 then
    n = n + 1
  else
    redis.call('ZADD', KEYS[4], now + tonumber(ARGV[1]), ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[1]) + 1000)
return n
"""

# SEED: start the current period's spend at what the ledger says (at a process's start),
# unless Redis already has a spend for that period (another process seeded or charged it).
#   ARGV[1] period   ARGV[2] tokens   ARGV[3] cost
#   returns 1 seeded, 0 kept
SEED = PRELUDE + """
local now = now_ms()
local p = ARGV[1]
local s = bounds(p, now)
if num(p .. '_s', -1) == s then return 0 end
put(p .. '_s', s)
put(p .. '_t', tonumber(ARGV[2]))
put(p .. '_c', tonumber(ARGV[3]))
touched()
return 1
"""
