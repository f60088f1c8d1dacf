--[[
floodgate: sliding log, the exact algorithm (SPEC 3); the Lua twin of
src/algorithm/sliding_log.rs. Validation keeps L <= 10000.

KEYS[1]  the bucket: a sorted set. Every booked unit is one member "<ts>:<seq>" scored by
         its booking time ts (ms); seq (zero-padded, 1..count at that ts) only makes members
         unique. The lock is the member "lock" scored by -locked_until, below every ts, so
         one key holds the whole state.
ARGV[1]  "charge" or "refund"
ARGV[2]  n: the cost (charge: 0 is a peek; refund: the cost to give back)
ARGV[3]  W: window length in ms (>= 1)
ARGV[4]  L: requests per window (1..10000)
ARGV[5]  B: burst (unused here; every script takes the same ARGV)
ARGV[6]  1 = on_over_limit consume; config validation rejects it for this algorithm and a
         denial never writes here (a log of denied bookings would only grow)
ARGV[7]  lockout in ms (0 = none)
ARGV[8]  refund only: booked_at, the now_ms that the charge being undone replied

Every write sets the key's expiry to the state's (PEXPIREAT, at least 1 ms ahead); see
fixed_window.lua for why absolute.

Reply, integers only:
  charge  {allowed 0|1, remaining, reset_ms, now_ms, booked 0|1}
  refund  {changed 0|1, now_ms}

One member per unit (rather than one per booking with a count) makes every question a
sorted-set lookup: the live count is ZCOUNT, the k-th oldest live unit is ZRANGE by rank.
A unit is live iff ts > now - W. Peeks and denials never write, so dead members linger
until the next booking trims them; they are ignored until then.
]]
-- The shared head (lua/prelude.lua) is prepended when the script is loaded.
if L > 10000 then
  return redis.error_reply('ERR floodgate sliding_log: bad arguments')
end

local horizon = int(now - W)
local lock_score = redis.call('ZSCORE', key, 'lock')
local locked = 0
if lock_score then
  locked = -tonumber(lock_score)
end

-- Live units: ts in (now - W, +inf). Lock and dead units sort below them.
local live = redis.call('ZCOUNT', key, '(' .. horizon, '+inf')

-- ms until the newest live unit leaves the window (0 when none is live).
local function until_newest_leaves()
  if live == 0 then
    return 0
  end
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return math.max(tonumber(newest[2]) + W - now, 0)
end

-- R for a denied k: until enough of the oldest live units have left the window.
local function wait(k)
  if k > L then
    return until_newest_leaves()
  end
  local excess = live + k - L
  local below = redis.call('ZCOUNT', key, '-inf', horizon)
  local unit = redis.call('ZRANGE', key, below + excess - 1, below + excess - 1, 'WITHSCORES')
  return math.max(tonumber(unit[2]) + W - now, 0)
end

-- Expiry: when the newest unit leaves the window, or the lock ends.
local function save()
  local expires = locked
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] and tonumber(newest[2]) > 0 then
    expires = math.max(expires, tonumber(newest[2]) + W)
  end
  if locked > 0 then
    redis.call('ZADD', key, int(-locked), 'lock')
  end
  -- A no-op when the set emptied (Redis deleted the key).
  redis.call('PEXPIREAT', key, int(math.max(expires, now + 1)))
end

-- Seq of the newest unit booked at ts (members at one score sort by their padded seq).
local function last_seq(ts)
  local m = redis.call('ZREVRANGEBYSCORE', key, int(ts), int(ts), 'LIMIT', 0, 1)
  if m[1] then
    return tonumber(string.match(m[1], ':(%d+)$'))
  end
  return 0
end

local function book(k)
  redis.call('ZREMRANGEBYSCORE', key, 0, horizon)
  local seq = last_seq(now)
  local stamp = int(now)
  local args = {}
  -- ZADD in slices: Lua's unpack limits the number of arguments.
  for i = 1, k do
    args[#args + 1] = stamp
    args[#args + 1] = stamp .. ':' .. string.format('%05d', seq + i)
    if #args >= 400 or i == k then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  live = live + k
end

if op == 'refund' then
  local booked_at = tonumber(ARGV[8])
  if not booked_at then
    return redis.error_reply('ERR floodgate sliding_log: bad booked_at')
  end
  -- Units that have left the window are already gone.
  if n == 0 or booked_at <= now - W then
    return {0, now}
  end
  local units = redis.call('ZREVRANGEBYSCORE', key, int(booked_at), int(booked_at), 'LIMIT', 0, n)
  if #units == 0 then
    return {0, now}
  end
  for i = 1, #units, 200 do
    redis.call('ZREM', key, unpack(units, i, math.min(i + 199, #units)))
  end
  redis.call('ZREMRANGEBYSCORE', key, 0, horizon)
  save()
  return {1, now}
end

-- Returns allowed, remaining, reset_ms, booked. A denial never books (see ARGV[6]).
local function check()
  if live + n <= L then
    book(n)
    return true, L - live, until_newest_leaves(), true
  end
  return false, 0, wait(n), false
end

-- A cost-1 probe that books nothing: allowed, remaining, reset_ms.
local function peek()
  if live < L then
    return true, L - live, until_newest_leaves()
  end
  return false, 0, wait(1)
end

-- The shared tail (lua/decide.lua) is appended here when the script is loaded.
