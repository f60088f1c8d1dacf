--[[
floodgate: what every algorithm uses and nothing per bucket changes: integer helpers, refund
bookkeeping. An EVALSHA script defines these once per call, after the lines that read the
server clock into `now` (src/backend/redis/scripts.rs), so a batch of many buckets defines
them once; the function library defines them once when it is loaded.
]]
-- Counts booked without a fit (consume) stop at 2^53: past it doubles lose integers.
local MAX = 9007199254740992

-- Integers go to Redis as exact decimals: tostring would round to 14 digits.
local function int(x)
  return string.format('%d', x)
end

-- ceil(a/b); floor of a double quotient is exact for integers 0 <= a < 2^53, b >= 1.
local function cdiv(a, b)
  local q = math.floor(a / b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- The greatest common divisor of integers a, b >= 0 (a token bucket's units: token_bucket.lua,
-- lease.lua).
local function gcd(a, b)
  while b ~= 0 do
    a, b = b, a % b
  end
  return a
end

-- Refunds are applied at most once: each bucket keeps the ids of its last RECENT_REFUNDS
-- applied refunds as one string "id,id,...", oldest first, and ignores a repeated id (a
-- refund re-sent after its reply was lost).
local RECENT_REFUNDS = 32

-- Id 0 is an undo inside the same script as its booking (lua/batch.lua): it can never be
-- re-sent, so it is neither checked nor recorded.
local function refund_seen(ids, id)
  return id ~= '0' and string.find(',' .. ids .. ',', ',' .. id .. ',', 1, true) ~= nil
end

-- ids with id appended, keeping the last RECENT_REFUNDS.
local function refund_remember(ids, id)
  if id == '0' then
    return ids
  end
  local list = {}
  for x in string.gmatch(ids, '[^,]+') do
    list[#list + 1] = x
  end
  list[#list + 1] = id
  return table.concat(list, ',', math.max(1, #list - RECENT_REFUNDS + 1), #list)
end

-- Buckets that a batch decides more than once (a hot key) are read and written through a
-- cache that lives for one call: one HMGET, then one HSET and one PEXPIREAT at the end,
-- instead of a round of commands per item. Nothing else runs inside a script, so the result
-- is the same as sending every command in order (Redis replicates a script's effects, so
-- the order in which flush() writes the buckets does not matter). Other buckets go straight
-- to Redis: a cache costs more than it saves for a bucket touched once. lua/batch.lua fills
-- `repeated`; every entry point ends with flush(), and each call of the function library
-- starts with forget().
local cache, repeated = {}, {}

-- Empties the cache and the set of repeated buckets.
local function forget()
  cache, repeated = {}, {}
end

-- HMGET key fields...: false for a missing field, as Redis answers it. A bucket is read
-- by one algorithm, always for the same fields, so the first read fetches all it needs.
local function hmget(key, ...)
  if not repeated[key] then
    return redis.call('HMGET', key, ...)
  end
  local names = {...}
  local entry = cache[key]
  if not entry then
    local values = redis.call('HMGET', key, ...)
    -- fields: name -> value; changed: the names written since, in order, and name -> true.
    entry = {fields = {}, changed = {}}
    for i = 1, #names do
      entry.fields[names[i]] = values[i]
    end
    cache[key] = entry
    return values
  end
  local out = {}
  for i = 1, #names do
    out[i] = entry.fields[names[i]]
  end
  return out
end

-- HSET key field value [field value ...], held until flush(); the bucket was read first.
local function hset(key, ...)
  if not repeated[key] then
    redis.call('HSET', key, ...)
    return
  end
  local entry = cache[key]
  local words = {...}
  for i = 1, #words, 2 do
    local name = words[i]
    if not entry.changed[name] then
      entry.changed[name] = true
      entry.changed[#entry.changed + 1] = name
    end
    entry.fields[name] = words[i + 1]
  end
end

-- PEXPIREAT key at, held until flush(); the last one wins, as it would in Redis.
local function pexpireat(key, at)
  if not repeated[key] then
    redis.call('PEXPIREAT', key, at)
    return
  end
  cache[key].expires = at
end

-- Writes every changed bucket (one HSET of its changed fields, then its expiry) and
-- empties the cache.
local function flush()
  for key, entry in pairs(cache) do
    if #entry.changed > 0 then
      local words = {}
      for _, name in ipairs(entry.changed) do
        words[#words + 1] = name
        words[#words + 1] = entry.fields[name]
      end
      redis.call('HSET', key, unpack(words))
    end
    if entry.expires then
      redis.call('PEXPIREAT', key, entry.expires)
    end
  end
  forget()
end
