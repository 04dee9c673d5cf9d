"""The Lua scripts behind `RedisSlotPool`: each atomic step of a shared pool is one script.

Every script works on the keys of one pool, which share a hash tag (Redis Cluster safe),
in this order:

    KEYS[1]  holders   sorted set  lease id -> expiry (ms, Redis clock)
    KEYS[2]  waiters   sorted set  ticket id -> class rank x 1e13 + sequence number
                                   (priority class first, then FIFO)
    KEYS[3]  alive     sorted set  ticket id -> expiry (ms): a waiter's heartbeat
    KEYS[4]  sequence  counter     the last sequence number handed out
    KEYS[5]  fencing   counter     the last fencing token handed out
    KEYS[6]  granted   sorted set  lease id -> grant time (ms): lease ages, for ETAs
    KEYS[7]  tokens    hash        lease id -> its fencing token
    KEYS[8]  version   counter     bumped by every change: replies and wake-ups carry it,
                                   so a replica keeps the newest counts it has heard of;
                                   it starts at Redis's time in ms x 1000, so it still grows
                                   across a restart that lost it
    KEYS[9]  shed      sorted set  ticket id -> expiry (ms): waiters displaced by a higher
                                   class, until their replica's POLL has told them
    KEYS[10] placed    hash        lease id -> the engine replica it runs on
    KEYS[11] seats     hash        engine replica -> its holders (absent: none)

A `fair` pool (`policies.slots.lua_fair`) keeps five more; a `fifo` one never touches them:

    KEYS[12] served    hash        tenant -> its weighted tokens served (a float)
    KEYS[13] shares    hash        ticket or lease id -> 'weight|prompt|expected|tenant':
                                   whose it is, what its grant charges (its prompt) and
                                   what the order's forecast charges (prompt and answer)
    KEYS[14] line      sorted set  score 0, members 'rank|tenant|seq|id' (seq on 13
                                   digits): each tenant's waiters of a class, by lex range
    KEYS[15] backlog   hash        'rank|tenant' -> its waiters in that class
    KEYS[16] last      string      the counter of the tenant granted last

A backend is a group of engine replicas, each with its slots. A process passes the replicas
it considers healthy as (name, slots) pairs in its order of preference; a grant goes to
the first of them with a free seat, so no replica ever holds more than its slots. (The
processes running the gateway are its "replicas" below only where said so: "a replica's
tickets" are one gateway process's.)

Time is Redis's own (`TIME`), never a replica's clock. Every script first drops expired
holders (a crashed replica's leases) and dead waiters (a crashed replica's tickets) and,
if it dropped any, publishes a wake-up so live waiters re-check. A ticket that is granted
becomes a lease with the same id.

Messages on a pool's channel read `kind:version:holders:waiters:sheddable:seats`, where
`seats` is `name=holders` per engine replica holding any, joined by commas. `release`,
`withdraw`, `expired`, `shed` and `moved` (a `fair` newcomer ahead of waiters of its class)
wake waiters (a slot may be theirs, or their place moved); `grant` only tells the other
replicas the new counts.
"""

from __future__ import annotations

KEY_NAMES = ("holders", "waiters", "alive", "seq", "fence", "granted", "tokens", "version",
             "shed", "placed", "seats", "served", "shares", "line", "backlog", "last")
WAKING_KINDS = (b"release", b"withdraw", b"expired", b"shed", b"moved")
SHED = -2  # POLL's status for a ticket displaced by a higher class

PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local SHED_FLOOR = 2e13  -- the scores of the sheddable class

local function state()
  return {tonumber(redis.call('GET', KEYS[8]) or '0'), redis.call('ZCARD', KEYS[1]),
          redis.call('ZCARD', KEYS[2]), redis.call('ZCOUNT', KEYS[2], SHED_FLOOR, '+inf'),
          redis.call('HGETALL', KEYS[11])}
end

local function seat_text(seats)
  local parts = {}
  for i = 1, #seats, 2 do table.insert(parts, seats[i] .. '=' .. seats[i + 1]) end
  return table.concat(parts, ',')
end

-- the holders of engine replica `name`
local function held(name)
  return tonumber(redis.call('HGET', KEYS[11], name) or '0')
end

-- the first replica with a free seat among the (name, slots) pairs of ARGV[from..to]
local function free_seat(from, to)
  for i = from, to, 2 do
    if held(ARGV[i]) < tonumber(ARGV[i + 1]) then return ARGV[i] end
  end
  return nil
end

-- the free seats of the replicas of ARGV[from..to]
local function free_seats(from, to)
  local free = 0
  for i = from, to, 2 do
    free = free + math.max(0, tonumber(ARGV[i + 1]) - held(ARGV[i]))
  end
  return free
end

-- a lease leaves its replica's seat
local function unseat(id)
  local replica = redis.call('HGET', KEYS[10], id)
  if replica then
    redis.call('HDEL', KEYS[10], id)
    if redis.call('HINCRBY', KEYS[11], replica, -1) <= 0 then
      redis.call('HDEL', KEYS[11], replica)
    end
  end
end

local function changed(kind, channel)
  if redis.call('EXISTS', KEYS[8]) == 0 then
    -- a fresh (or restarted, empty) Redis: start above every version it gave before
    redis.call('SET', KEYS[8], string.format('%.0f', now_ms() * 1000))
  end
  redis.call('INCR', KEYS[8])
  local s = state()
  if kind then
    redis.call('PUBLISH', channel,
               string.format('%s:%.0f:%d:%d:%d:%s', kind, s[1], s[2], s[3], s[4],
                             seat_text(s[5])))
  end
  return s
end

-- `gone` (a fair pool's): told of each expired lease (false) and dead waiter (true) first
local function purge(now, channel, gone)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  for _, id in ipairs(expired) do
    if gone then gone(id, false) end
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[6], id)
    redis.call('HDEL', KEYS[7], id)
    unseat(id)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', now)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for _, id in ipairs(dead) do
    if gone then gone(id, true) end
    redis.call('ZREM', KEYS[3], id)
    redis.call('ZREM', KEYS[2], id)
  end
  if #expired + #dead > 0 then
    changed('expired', channel)
  end
end

-- A full line's room for a newcomer of class `rank`: the newest sheddable waiter, if the
-- newcomer outranks it, leaves the line marked shed (for `ttl`); true if one did.
-- `leave` (a fair pool's) is told of it first.
local function shed_for(rank, now, ttl, leave)
  if rank >= 2 then return false end
  local victim = redis.call('ZREVRANGEBYSCORE', KEYS[2], '+inf', SHED_FLOOR, 'LIMIT', 0, 1)[1]
  if victim == nil then return false end
  if leave then leave(victim) end
  redis.call('ZREM', KEYS[2], victim)
  redis.call('ZREM', KEYS[3], victim)
  redis.call('ZADD', KEYS[9], now + ttl, victim)
  return true
end

local function grant(id, now, ttl, replica)
  local token = redis.call('INCR', KEYS[5])
  redis.call('ZADD', KEYS[1], now + ttl, id)
  redis.call('ZADD', KEYS[6], now, id)
  redis.call('HSET', KEYS[7], id, token)
  redis.call('HSET', KEYS[10], id, replica)
  redis.call('HINCRBY', KEYS[11], replica, 1)
  return token
end

-- POLL's report on a ticket no longer in line: granted already (a reply lost to a
-- timeout: its token and replica again), displaced by a higher class, or gone
local function not_waiting(id, out)
  local token = redis.call('HGET', KEYS[7], id)
  if token then
    table.insert(out, 1)
    table.insert(out, tonumber(token))
    table.insert(out, redis.call('HGET', KEYS[10], id))
  elseif redis.call('ZREM', KEYS[9], id) == 1 then
    table.insert(out, -2)
    table.insert(out, 0)
    table.insert(out, '')
  else
    table.insert(out, -1)
    table.insert(out, 0)
    table.insert(out, '')
  end
end

-- POLL's reply: the pool's state (after announcing its grants, if any), Redis's time,
-- the leases' grant times, then each ticket's (status, value, replica) of `out`
local function poll_reply(now, grants, channel, out)
  local s = state()
  if grants > 0 then
    s = changed('grant', channel)
  end
  local times = redis.call('ZRANGE', KEYS[6], 0, -1, 'WITHSCORES')
  local granted = {}
  for i = 2, #times, 2 do table.insert(granted, times[i]) end
  local head = {s[1], s[2], s[3], s[4], now, granted, s[5]}
  for _, v in ipairs(out) do table.insert(head, v) end
  return head
end
"""

# ACQUIRE: a free slot for a newcomer, only when nobody waits (newcomers never overtake),
# on the first of the process's replicas with a free seat.
#   ARGV[1] lease id   ARGV[2] ttl ms   ARGV[3] wake-up channel
#   ARGV[4..] the replicas as name, slots pairs, in the order of preference
#   returns {token or 0, version, holders, waiters, sheddable, {seats}, replica or ''}
ACQUIRE = PRELUDE + """
local now = now_ms()
purge(now, ARGV[3])
local s = state()
local replica = s[3] == 0 and free_seat(4, #ARGV)
if replica then
  local token = grant(ARGV[1], now, tonumber(ARGV[2]), replica)
  s = changed(nil, ARGV[3])
  return {token, s[1], s[2], s[3], s[4], s[5], replica}
end
return {0, s[1], s[2], s[3], s[4], s[5], ''}
"""

# ENQUEUE: a place at the end of its class's line, unless the line is full; then a
# newcomer of a higher class than `sheddable` takes the place of the newest sheddable one.
#   ARGV[1] queue limit   ARGV[2] ticket id   ARGV[3] ttl ms   ARGV[4] wake-up channel
#   ARGV[5] class rank (0 critical, 1 standard (the default), 2 sheddable)
#   returns {position (1 = next) or 0 when full, version, holders, waiters, sheddable,
#            {seats}}
ENQUEUE = PRELUDE + """
local now = now_ms()
local ttl, rank = tonumber(ARGV[3]), tonumber(ARGV[5] or '1')
purge(now, ARGV[4])
local s = state()
local kind = nil
if s[3] >= tonumber(ARGV[1]) then
  if not shed_for(rank, now, ttl) then
    return {0, s[1], s[2], s[3], s[4], s[5]}
  end
  kind = 'shed'
end
local seq = redis.call('INCR', KEYS[4])
redis.call('ZADD', KEYS[2], string.format('%.0f', rank * 1e13 + seq), ARGV[2])
redis.call('ZADD', KEYS[3], now + ttl, ARGV[2])
s = changed(kind, ARGV[4])
return {redis.call('ZRANK', KEYS[2], ARGV[2]) + 1, s[1], s[2], s[3], s[4], s[5]}
"""

# POLL: for each of one gateway process's tickets, grant it if its rank is below the free
# seats of the process's replicas (so every ticket ahead of it can be served too: FIFO
# across processes), on the first of them with a free seat; else refresh its heartbeat
# and report its position. A ticket already granted (a reply lost to a timeout) is
# reported granted again, with its token and replica.
#   ARGV[1] ttl ms   ARGV[2] wake-up channel   ARGV[3] n, the number of replicas
#   ARGV[4..3+2n] the replicas as name, slots pairs, in the order of preference
#   ARGV[4+2n..] ticket ids
#   returns {version, holders, waiters, sheddable, now, {grant times...}, {seats},
#            status1, value1, replica1...}
#     status 1: granted, value = fencing token, replica = its replica; 0: waiting,
#     value = position; -1: gone; -2: displaced by a higher class (shed); replica ''
#     unless granted
POLL = PRELUDE + """
local now = now_ms()
local ttl = tonumber(ARGV[1])
local last = 3 + 2 * tonumber(ARGV[3])  -- the last ARGV of the replicas
purge(now, ARGV[2])
local out = {}
local grants = 0
for i = last + 1, #ARGV do
  local id = ARGV[i]
  local rank = redis.call('ZRANK', KEYS[2], id)
  if rank then
    if rank < free_seats(4, last) then
      local replica = free_seat(4, last)
      redis.call('ZREM', KEYS[2], id)
      redis.call('ZREM', KEYS[3], id)
      table.insert(out, 1)
      table.insert(out, grant(id, now, ttl, replica))
      table.insert(out, replica)
      grants = grants + 1
    else
      redis.call('ZADD', KEYS[3], 'XX', now + ttl, id)
      table.insert(out, 0)
      table.insert(out, rank + 1)
      table.insert(out, '')
    end
  else
    not_waiting(id, out)
  end
end
return poll_reply(now, grants, ARGV[2], out)
"""

# RENEW: extend a held lease. A lease that vanished (its holder was cut off past the TTL,
# or Redis restarted empty) is taken again if its replica has a free seat, ahead of any
# waiter, since the engine is still running it; if its seat was given to someone else, it
# is lost.
#   ARGV[1] lease id   ARGV[2] ttl ms   ARGV[3] its replica's slots   ARGV[4] wake-up channel
#   ARGV[5] its replica
#   returns 1 renewed, 2 re-registered, 0 lost
RENEW = PRELUDE + """
local now = now_ms()
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  return 1
end
purge(now, ARGV[4])
if held(ARGV[5]) < tonumber(ARGV[3]) then
  grant(ARGV[1], now, tonumber(ARGV[2]), ARGV[5])
  changed('grant', ARGV[4])
  return 2
end
return 0
"""

# RELEASE: give a lease back (idempotent) and wake the waiters of every process.
#   ARGV[1] lease id   ARGV[2] wake-up channel
#   returns {1 released or 0 not held (released already or expired), version, holders,
#            waiters, sheddable, {seats}}
RELEASE = PRELUDE + """
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  unseat(ARGV[1])
  local s = changed('release', ARGV[2])
  return {1, s[1], s[2], s[3], s[4], s[5]}
end
local s = state()
return {0, s[1], s[2], s[3], s[4], s[5]}
"""

# WITHDRAW: leave the line (idempotent); those behind move up, so wake them.
#   ARGV[1] ticket id   ARGV[2] wake-up channel
#   returns {1 left or 0 not in line (granted, expired, shed or gone), version, holders,
#            waiters, sheddable, {seats}}
WITHDRAW = PRELUDE + """
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  local s = changed('withdraw', ARGV[2])
  return {1, s[1], s[2], s[3], s[4], s[5]}
end
redis.call('ZREM', KEYS[9], ARGV[1])
local s = state()
return {0, s[1], s[2], s[3], s[4], s[5]}
"""
