--[[
floodgate: sliding window, the weighted two-window counter (docs/algorithms.md#sliding-window); the
Lua twin of src/algorithm/sliding_window.rs. Validation keeps L*W <= 2^53, so products stay exact.

KEYS[1]  the bucket: a hash {w = window index, c = current count, p = previous count,
         lk = locked-until ms (0 = none),
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

Every write leaves the key's expiry at the state's (PEXPIREAT, at least 1 ms ahead); see
fixed_window.lua for why absolute.

Reply, integers only:
  charge  {allowed 0|1, remaining, reset_ms, now_ms, booked 0|1}
  refund  {changed 0|1, now_ms}
]]
-- Defined once with the algorithm (see lua/prelude.lua); load() sets the bucket's state on
-- every call, and the shared tail (lua/decide.lua) then decides with check/peek/save.

-- The bucket's state (e: elapsed ms in the window, in 0..W-1), and what was stored: when
-- only the current count moves (same window, previous count and lock), the expiry stays as
-- it is, so one HSET of the count is the whole write.
local window, c, p, locked, e
local window0, c0, p0, locked0

local function save()
  if c > 0 and c0 > 0 and window == window0 and p == p0 and locked == locked0 then
    hset(key, 'c', int(c))
    return
  end
  local expires = locked
  if c > 0 then
    expires = math.max(expires, (window + 2) * W)
  elseif p > 0 then
    expires = math.max(expires, (window + 1) * W)
  end
  hset(key, 'w', int(window), 'c', int(c), 'p', int(p), 'lk', int(locked))
  pexpireat(key, int(math.max(expires, now + 1)))
end

-- Reads the bucket and rolls it to now; applies a refund. Returns the reply to
-- give at once (a refund's, or an error), or nil for a charge to go on.
local function load()
  local s = hmget(key, 'w', 'c', 'p', 'lk', 'r')
  local refunds = s[5] or ''
  window = tonumber(s[1]) or 0
  c = tonumber(s[2]) or 0
  p = tonumber(s[3]) or 0
  locked = tonumber(s[4]) or 0
  window0, c0, p0, locked0 = window, c, p, locked

  -- Roll to now: the current count becomes the previous one in the next window; older
  -- counts are gone. An earlier window (the clock went backwards) keeps the stored state.
  local cur = math.floor(now / W)
  if (c == 0 and p == 0) or cur > window + 1 then
    window, c, p = cur, 0, 0
  elseif cur == window + 1 then
    window, c, p = cur, 0, c
  end
  e = math.min(math.max(now - window * W, 0), W - 1)

  if op == 'refund' then
    if refund_seen(refunds, refund_id) then
      return {0, now}
    end
    local b = math.floor(booked_at / W)
    if window == b and c > 0 and n > 0 then
      c = c - math.min(c, n)
    elseif window == b + 1 and p > 0 and n > 0 then
      p = p - math.min(p, n)
    else
      return {0, now}
    end
    save()
    hset(key, 'r', refund_remember(refunds, refund_id))
    return {1, now}
  end
end

-- The remaining count after booking k, or nil when k does not fit. Testing c + k <= L
-- first keeps every product below L*W.
local function fit(k)
  if c + k > L then
    return nil
  end
  local left = L * W - p * (W - e) - (c + k) * W
  if left < 0 then
    return nil
  end
  return math.floor(left / W)
end

-- R for a denied k: the earliest wait after which k fits if nothing else is booked.
local function wait(k)
  if c + k <= L and p > 0 then
    return cdiv(math.max(p * (W - e) - (L - c - k) * W, 0), p)
  elseif k > L or c == 0 then
    return (W - e) + W
  end
  return (W - e) + W - math.floor((L - k) * W / c)
end

-- Returns allowed, remaining, reset_ms, booked.
local function check(book_on_deny)
  local remaining = fit(n)
  if remaining then
    c = c + n
    return true, remaining, W - e, true
  end
  if book_on_deny then
    -- Debt has an end: a cost fills the window, never more (sliding_window.rs); the wait
    -- is then until a cost-1 request fits.
    c = math.min(c + n, math.max(c, L))
    return false, 0, wait(1), true
  end
  return false, 0, wait(n), false
end

-- A cost-1 probe that books nothing: allowed, remaining, reset_ms.
local function peek()
  local remaining = fit(1)
  if remaining then
    -- What is left without booking the probe: one more than after booking it.
    return true, remaining + 1, W - e
  end
  return false, 0, wait(1)
end
