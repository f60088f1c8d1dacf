--[[
floodgate: fixed window (docs/algorithms.md#fixed-window), the Lua twin of
src/algorithm/fixed_window.rs.

KEYS[1]  the bucket: a hash {w = window index, c = count, lk = locked-until ms (0 = none),
         r = ids of the last refunds applied (see lib.lua)}
ARGV[1]  "charge" or "refund"
ARGV[2]  n: the cost (charge: 0 is a peek; refund: the cost to give back)
ARGV[3]  W: window length in ms (>= 1)
ARGV[4]  L: requests per window (>= 1)
ARGV[5]  B: burst (unused here; every script takes the same ARGV)
ARGV[6]  1 = on_over_limit consume (book the cost even when denied), 0 = reject
ARGV[7]  lockout in ms (0 = none)
ARGV[8]  refund: booked_at, the now_ms that the charge being undone replied; charge: its
         spread, ignored here (a window is handed only the part of a report inside it)
ARGV[9]  refund only: the refund's id (decimal u64); a repeated id changes nothing

Reply, integers only:
  charge  {allowed 0|1, remaining, reset_ms, now_ms, booked 0|1}
  refund  {changed 0|1, now_ms}

Time is the server's clock (TIME), so every client agrees on window boundaries. Every write
leaves the key's expiry at the state's (PEXPIREAT, at least 1 ms ahead), so idle buckets
vanish on their own. Absolute, because a relative TTL counts from Redis' own time for the
command, which can trail TIME by a millisecond: the key could vanish while it still counts.
]]
-- Defined once with the algorithm (see lua/prelude.lua); load() sets the bucket's state on
-- every call, and the shared tail (lua/decide.lua) then decides with check/peek/save.

-- The bucket's state, and what was stored: when only the count moves within the window and
-- the lock, the other fields and the expiry stay as they are, so one HSET of the count is the
-- whole write.
local window, count, locked, reset
local window0, count0, locked0

local function save()
  if count > 0 and count0 > 0 and window == window0 and locked == locked0 then
    hset(key, 'c', int(count))
    return
  end
  local expires = locked
  if count > 0 then
    expires = math.max(expires, (window + 1) * W)
  end
  hset(key, 'w', int(window), 'c', int(count), 'lk', int(locked))
  pexpireat(key, int(math.max(expires, now + 1)))
end

-- Reads the bucket and rolls it to now; applies a refund. Returns the reply to
-- give at once (a refund's, or an error), or nil for a charge to go on.
local function load()
  local s = hmget(key, 'w', 'c', 'lk', 'r')
  local refunds = s[4] or ''
  window = tonumber(s[1]) or 0
  count = tonumber(s[2]) or 0
  locked = tonumber(s[3]) or 0
  window0, count0, locked0 = window, count, locked

  if op == 'refund' then
    if refund_seen(refunds, refund_id) then
      return {0, now}
    end
    -- A booking from another window is already forgotten.
    if math.floor(booked_at / W) ~= window or count == 0 or n == 0 then
      return {0, now}
    end
    count = count - math.min(count, n)
    save()
    hset(key, 'r', refund_remember(refunds, refund_id))
    return {1, now}
  end

  -- Roll into the current window. An older one (the clock went backwards) keeps counting
  -- in the stored window unless that is empty.
  local cur = math.floor(now / W)
  if cur > window or count == 0 then
    window = cur
    count = 0
  end
  reset = math.max((window + 1) * W - now, 0)
end

-- Returns allowed, remaining, reset_ms, booked.
local function check(book_on_deny)
  if count + n <= L then
    count = count + n
    return true, L - count, reset, true
  end
  if book_on_deny then
    count = math.min(count + n, MAX)
  end
  return false, 0, reset, book_on_deny
end

-- A cost-1 probe that books nothing: allowed, remaining, reset_ms.
local function peek()
  return count < L, math.max(L - count, 0), reset
end
