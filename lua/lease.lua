--[[
floodgate: a global rule's lease in one region (src/limiter/regions/, docs/regions.md): the
escrow of the demarcation protocol. Each region's Redis holds, beside each global bucket, the
part of its limit this region may use (its lease) and two monotonic counters per other region:
what this region granted it in total, and what this region received from it in total. A region
grows its lease only by what another granted (read from that region's Redis, applied once: the
counter only moves forward), and grants only what it takes out of its own unused lease here,
atomically with the bucket's state. So the leases of all regions add up to at most the limit
whatever the messages do.

Loaded after the helpers (lua/lib.lua) and the ALGORITHMS table (src/backend/redis/scripts.rs).

KEYS[1]  the bucket (its algorithm's state)
KEYS[2]  its lease (`<bucket>:lease:<L>`: a changed limit starts again from the bases): a
         hash {l = this region's lease (absent: the base), x = 1 once a transfer
         was made, o.<region> = granted to that region in total, i.<region> = received from
         it in total, dw dc dp = demand: the period's index, its count, the previous period's}
KEYS[3]  the period's lock: one replica of the region runs the bucket's transfers per period
ARGV[1]  op: sync | read | receive | grant
ARGV[2]  base: this region's lease before any transfer
ARGV[3]  the period in ms

sync     ARGV[4] demand to add (this replica's requests since its last sync), ARGV[5] the
         replica's id -> {lease, demand, 1 if this replica runs the period's transfers, then
         the hash's o.* and i.* fields as name, value pairs}
read     ARGV[4] the reading region -> {lease, demand, granted to it, received from it}
receive  ARGV[4] the granting region, ARGV[5] its total granted to this region as read there,
         ARGV[6..9] algorithm W L B -> what this call added to the lease
grant    ARGV[4] the receiving region, ARGV[5] how much to grant at most, ARGV[6..11]
         algorithm W L B consume lockout -> what was granted (what the bucket had unused)

`demand` is the larger of the current and the previous period's count.
]]
local TOKEN_BUCKET = 2
local bucket, leases, lock = KEYS[1], KEYS[2], KEYS[3]
local op, base, period = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if not (base and period) or base < 0 or period < 1 then
  return redis.error_reply('ERR floodgate lease: bad arguments')
end

local function number(field)
  return tonumber(redis.call('HGET', leases, field))
end

local function lease_now()
  return number('l') or base
end

-- The demand counters rolled to the current period: count, previous count.
local function demand()
  local index = math.floor(now / period)
  local s = redis.call('HMGET', leases, 'dw', 'dc', 'dp')
  local at, count, previous = tonumber(s[1]) or index, tonumber(s[2]) or 0, tonumber(s[3]) or 0
  if at == index - 1 then
    return 0, count
  elseif at < index - 1 then
    return 0, 0
  end
  return count, previous
end

-- Keeps the hash while it records a transfer (a counter that vanished in one region and not
-- in another would count a grant twice); an untouched one ends with its demand.
local function keep()
  if redis.call('HEXISTS', leases, 'x') == 1 then
    redis.call('PERSIST', leases)
  else
    redis.call('PEXPIRE', leases, math.max(10 * period, 60000))
  end
end

-- A token bucket keeps its level in units of its own rate (lua/token_bucket.lua: fields u at
-- t, U = W/g ms a request, leaking L/g a ms). When its lease (its L) moves from old to new,
-- the level is leaked to now at the old rate and re-expressed in the new units, rounded up:
-- never more room than it had. A lease of nothing was given away full (see grant).
local function rescale(algorithm, W, old, new)
  if algorithm ~= TOKEN_BUCKET or old == new or new < 1 then
    return
  end
  local s = redis.call('HMGET', bucket, 'u', 't')
  local u, t = tonumber(s[1]), tonumber(s[2])
  if not u then
    return
  end
  local level = 0
  if old >= 1 then
    local g0, g1 = gcd(W, old), gcd(W, new)
    local left = math.max(u - math.max(now - t, 0) * (old / g0), 0)
    level = math.ceil(left * (W / g1) / (W / g0))
  end
  redis.call('HSET', bucket, 'u', int(level), 't', int(now))
end

-- Sets the lease to l (from old) and writes the transfer counter field += amount.
local function move(algorithm, W, old, l, field, amount)
  rescale(algorithm, W, old, l)
  redis.call('HSET', leases, 'l', int(l), 'x', 1)
  redis.call('HINCRBY', leases, field, amount)
  keep()
end

if op == 'sync' then
  local add = tonumber(ARGV[4]) or 0
  local count, previous = demand()
  count = count + math.max(add, 0)
  redis.call('HSET', leases, 'dw', int(math.floor(now / period)), 'dc', int(count),
    'dp', int(previous))
  keep()
  -- The lock lasts a period; its holder keeps it while it comes back in time.
  local runs = 0
  if redis.call('SET', lock, ARGV[5], 'NX', 'PX', period) or redis.call('GET', lock) == ARGV[5]
  then
    redis.call('PEXPIRE', lock, period + math.floor(period / 2))
    runs = 1
  end
  local reply = {lease_now(), math.max(count, previous), runs}
  local all = redis.call('HGETALL', leases)
  for i = 1, #all, 2 do
    local kind = string.sub(all[i], 1, 2)
    if kind == 'o.' or kind == 'i.' then
      reply[#reply + 1] = all[i]
      reply[#reply + 1] = all[i + 1]
    end
  end
  return reply
end

if op == 'read' then
  local count, previous = demand()
  local region = ARGV[4]
  return {lease_now(), math.max(count, previous), number('o.' .. region) or 0,
    number('i.' .. region) or 0}
end

local algorithm, W, L, B = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]),
  tonumber(ARGV[9])
if not (algorithm and ALGORITHMS[algorithm] and W and L and B) or W < 1 or L < 1 or B < 1 then
  return redis.error_reply('ERR floodgate lease: bad policy')
end

if op == 'receive' then
  local region, seen = ARGV[4], tonumber(ARGV[5])
  local field = 'i.' .. region
  local had = number(field) or 0
  if not seen or seen <= had then
    return 0
  end
  local old = lease_now()
  move(algorithm, W, old, old + seen - had, field, seen - had)
  return seen - had
end

if op == 'grant' then
  local region, want = ARGV[4], tonumber(ARGV[5]) or 0
  local consume, lockout = ARGV[10] or '0', ARGV[11] or '0'
  local l = lease_now()
  local b = math.floor(B * l / L)
  if want < 1 or l < 1 or b < 1 then
    return 0
  end
  -- What the bucket has unused now, under its lease: a peek changes nothing.
  local reply = ALGORITHMS[algorithm]({bucket}, {'charge', 0, W, l, b, consume, lockout, '0', '0'})
  local remaining = reply[2] or 0
  -- A window gives up counts it has not used; a token bucket the capacity B(l) - B(l - g),
  -- at most ceil(g B / L), out of the tokens it holds.
  local most = remaining
  if algorithm == TOKEN_BUCKET then
    most = math.floor(remaining * L / B)
  end
  local g = math.min(want, l, most)
  if g < 1 then
    return 0
  end
  move(algorithm, W, l, l - g, 'o.' .. region, g)
  return g
end

return redis.error_reply('ERR floodgate lease: unknown op')
