--[[
floodgate: sliding log, the exact algorithm (docs/algorithms.md#sliding-log); the Lua twin of
src/algorithm/sliding_log.rs. Validation keeps L <= 10000.

KEYS[1]  the bucket: a sorted set holding
           "<ts>:<count>"  scored ts (> 0): the bookings made at ms ts, one member per
                           instant (a second booking at the same ms replaces it with the sum)
           "total"         scored -(sum of every stored count), present while that is > 0
           "lock"          scored -locked_until, present while a lock was set
           "ids:<list>"    scored -inf: the ids of the last refunds applied (see lib.lua)
         so one key holds the whole state, and memory and work per booking do not grow
         with its cost.
ARGV[1]  "charge" or "refund"
ARGV[2]  n: the cost (charge: 0 is a peek; refund: the cost to give back)
ARGV[3]  W: window length in ms (>= 1)
ARGV[4]  L: requests per window (1..10000)
ARGV[5]  B: burst (unused here; every script takes the same ARGV)
ARGV[6]  1 = on_over_limit consume: a denial books its cost into the newest booking, moved
         to now (see check), so the log never holds more members than admitted bookings
ARGV[7]  lockout in ms (0 = none)
ARGV[8]  refund: booked_at, the now_ms that the charge being undone replied; charge: its
         spread, ignored here (a window is handed only the part of a report inside it)
ARGV[9]  refund only: the refund's id (decimal u64); a repeated id changes nothing

Every write sets the key's expiry to the state's (PEXPIREAT, at least 1 ms ahead); see
fixed_window.lua for why absolute.

Reply, integers only:
  charge  {allowed 0|1, remaining, reset_ms, now_ms, booked 0|1}
  refund  {changed 0|1, now_ms}

A booking is live iff ts > now - W. The live count is the running total once the bookings
that have left the window are dropped: every call drops them first (adjusting the total),
so each member is read once after it dies and the count costs O(1) amortized. Dropping
them never changes an answer, so a peek or a denial that finds such bookings removes them
(the only writes a peek or denial makes). A denial's wait reads the live bookings from the
nearer end of the log (see wait): at most min(k, L - k + 1) members, 5,000 at most.
]]
-- Defined once with the algorithm (see lua/prelude.lua); load() sets the bucket's state on
-- every call, and the shared tail (lua/decide.lua) then decides with check/peek/save.

-- The bucket's state: the lock and the live count.
local locked, live

-- The count of a booking member "<ts>:<count>".
local function units(member)
  return tonumber(string.match(member, ':(%d+)$'))
end

-- Stores the live count as the member "total".
local function store_total()
  if live > 0 then
    redis.call('ZADD', key, int(-live), 'total')
  else
    redis.call('ZREM', key, 'total')
  end
end

-- The newest booking's ts, or nil when none is stored.
local function newest_ts()
  local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(0', 'WITHSCORES', 'LIMIT', 0, 1)
  return tonumber(newest[2])
end

-- ms until the newest booking leaves the window (0 when none is live).
local function until_newest_leaves()
  if live == 0 then
    return 0
  end
  return math.max(newest_ts() + W - now, 0)
end

-- R for a denied k: until enough of the oldest live units have left the window, that is
-- the wait for the oldest booking b such that the units booked after b add up to at most
-- L - k. Walking from the oldest, b is found within `excess` members (each holds at least
-- one unit); walking from the newest, within L - k + 1. One ZRANGE from the nearer end reads
-- at most min(excess, L - k + 1) members, at most (L + 1) / 2 = 5,000: O(log N + that), and
-- a cost near L (the costly case when walked from the oldest) reads a single member.
-- A log over its limit (the rule's limit was lowered, for one window) waits until the
-- newest booking leaves, an upper bound that reads one member, so no denial reads more
-- than min(k, L - k + 1) members (`wait_reads` in src/algorithm/sliding_log.rs).
local function wait(k)
  if k > L or live > L then
    -- Nothing live: as long as a booking of k would last, never 0 for a denial.
    if live == 0 then
      return W
    end
    return until_newest_leaves()
  end
  local excess = live + k - L
  local room = L - k
  if excess <= room + 1 then
    local oldest = redis.call('ZRANGEBYSCORE', key, '(0', '+inf', 'WITHSCORES', 'LIMIT', 0, excess)
    local left = 0
    for i = 1, #oldest, 2 do
      left = left + units(oldest[i])
      if left >= excess then
        return math.max(tonumber(oldest[i + 1]) + W - now, 0)
      end
    end
  else
    local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(0', 'WITHSCORES', 'LIMIT', 0,
      room + 1)
    local after = 0
    for i = 1, #newest, 2 do
      after = after + units(newest[i])
      if after > room then
        return math.max(tonumber(newest[i + 1]) + W - now, 0)
      end
    end
  end
  -- Unreachable while the total is the sum of the bookings; stay well-defined.
  return until_newest_leaves()
end

-- Expiry: when the newest booking leaves the window, or the lock ends.
local function save()
  local expires = locked
  local newest = newest_ts()
  if newest then
    expires = math.max(expires, newest + W)
  end
  if locked > 0 then
    redis.call('ZADD', key, int(-locked), 'lock')
  end
  store_total()
  -- A no-op when the set emptied (Redis deleted the key).
  redis.call('PEXPIREAT', key, int(math.max(expires, now + 1)))
end

-- Replaces the booking at ts (if any) by one of its count plus delta; returns the old count.
local function rebook(ts, delta)
  local stamp = int(ts)
  local found = redis.call('ZRANGEBYSCORE', key, stamp, stamp, 'LIMIT', 0, 1)
  local count = 0
  if found[1] then
    count = units(found[1])
    redis.call('ZREM', key, found[1])
  end
  if count + delta > 0 then
    redis.call('ZADD', key, stamp, stamp .. ':' .. int(count + delta))
  end
  live = live + delta
  return count
end

-- Reads the bucket and drops the bookings that have left the window; applies a refund.
-- Returns the reply to give at once (a refund's, or an error), or nil for a charge to go on.
local function load()
  if L > 10000 then
    return redis.error_reply('ERR floodgate sliding_log: bad arguments')
  end

  local horizon = int(now - W)
  local lock_score = redis.call('ZSCORE', key, 'lock')
  locked = 0
  if lock_score then
    locked = -tonumber(lock_score)
  end
  local total_score = redis.call('ZSCORE', key, 'total')
  live = 0
  if total_score then
    live = -tonumber(total_score)
  end

  -- Drop the bookings that have left the window.
  local dead = redis.call('ZRANGEBYSCORE', key, '(0', horizon)
  if #dead > 0 then
    for i = 1, #dead do
      live = live - units(dead[i])
    end
    redis.call('ZREMRANGEBYSCORE', key, '(0', horizon)
    store_total()
  end

  if op == 'refund' then
    local found = redis.call('ZRANGEBYSCORE', key, '-inf', '-inf', 'LIMIT', 0, 1)
    local ids = ''
    if found[1] then
      ids = string.sub(found[1], 5)
    end
    -- Units that have left the window are already gone.
    if n == 0 or booked_at <= now - W or refund_seen(ids, refund_id) then
      return {0, now}
    end
    local booking = redis.call('ZRANGEBYSCORE', key, int(booked_at), int(booked_at), 'LIMIT', 0, 1)
    if not booking[1] then
      return {0, now}
    end
    rebook(booked_at, -math.min(n, units(booking[1])))
    if refund_id ~= '0' then
      if found[1] then
        redis.call('ZREM', key, found[1])
      end
      redis.call('ZADD', key, '-inf', 'ids:' .. refund_remember(ids, refund_id))
    end
    save()
    return {1, now}
  end
end

-- Books a denied k under consume: into the newest booking, moved to now (merged in place
-- when the clock went backwards), or as the first booking of an empty log; the live count
-- is capped at 2^53.
local function book_over(k)
  k = math.min(k, MAX - live)
  local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(0', 'WITHSCORES', 'LIMIT', 0, 1)
  if not newest[1] then
    rebook(now, k)
    return
  end
  local ts = tonumber(newest[2])
  if ts >= now then
    rebook(ts, k)
    return
  end
  local count = units(newest[1])
  redis.call('ZREM', key, newest[1])
  live = live - count
  rebook(now, count + k)
end

-- Returns allowed, remaining, reset_ms, booked.
local function check(book_on_deny)
  if live + n <= L then
    rebook(now, n)
    return true, L - live, until_newest_leaves(), true
  end
  local reset = wait(n)
  if book_on_deny then
    book_over(n)
  end
  return false, 0, reset, book_on_deny
end

-- A cost-1 probe that books nothing: allowed, remaining, reset_ms.
local function peek()
  if live < L then
    return true, L - live, until_newest_leaves()
  end
  return false, 0, wait(1)
end
