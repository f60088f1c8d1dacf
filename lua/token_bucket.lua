--[[
floodgate: token bucket as integer GCRA (docs/algorithms.md#token-bucket), the Lua twin of
src/algorithm/token_bucket.rs.

Scaling keeps everything integral: g = gcd(W, L), one request is U = W/g units, the level
leaks lambda = L/g units per ms, capacity C = B*U. Validation keeps C <= 2^53, so every
quantity below is an exact double.

KEYS[1]  the bucket: a hash {u = level in units, t = ms of u, lk = locked-until ms (0 = none),
         r = ids of the last refunds applied (see lib.lua)}
ARGV[1]  "charge" or "refund"
ARGV[2]  n: the cost (charge: 0 is a peek; refund: the cost to give back)
ARGV[3]  W: window length in ms (>= 1)
ARGV[4]  L: requests per window (>= 1)
ARGV[5]  B: burst, the capacity in requests (>= 1)
ARGV[6]  1 = on_over_limit consume (book the cost even when denied), 0 = reject
ARGV[7]  lockout in ms (0 = none)
ARGV[8]  refund: booked_at, the now_ms that the charge being undone replied; charge: its
         spread s, the ms before now its cost was spent over (at most 3,600,000): the cost
         is booked from max(t, now - s) and leaks from then
ARGV[9]  refund only: the refund's id (decimal u64); a repeated id changes nothing

Every write sets the key's expiry to the state's (PEXPIREAT, at least 1 ms ahead); see
fixed_window.lua for why absolute.

Reply, integers only:
  charge  {allowed 0|1, remaining, reset_ms, now_ms, booked 0|1}
  refund  {changed 0|1, now_ms}
]]
-- Defined once with the algorithm (see lua/prelude.lua); load() sets the bucket's state on
-- every call, and the shared tail (lua/decide.lua) then decides with check/peek/save.

-- The scaling of this call's policy, and the bucket's state. u0: what is left at now.
local U, lambda, C
local level, updated, locked, u0

local function save()
  local expires = math.max(updated + cdiv(level, lambda), locked)
  hset(key, 'u', int(level), 't', int(updated), 'lk', int(locked))
  pexpireat(key, int(math.max(expires, now + 1)))
end

-- Reads the bucket and leaks it to now; applies a refund. Returns the reply to
-- give at once (a refund's, or an error), or nil for a charge to go on.
local function load()
  local g = gcd(W, L)
  U = W / g
  lambda = L / g
  C = B * U

  local s = hmget(key, 'u', 't', 'lk', 'r')
  local refunds = s[4] or ''
  level = tonumber(s[1]) or 0
  updated = tonumber(s[2]) or 0
  locked = tonumber(s[3]) or 0

  -- A clock going backwards leaks nothing; a leak too large for a double is still larger
  -- than the level, so the max() below stays exact.
  u0 = level - math.max(now - updated, 0) * lambda
  if u0 < 0 then
    u0 = 0
  end

  if op == 'refund' then
    if refund_seen(refunds, refund_id) then
      return {0, now}
    end
    -- Give back what the booking may still hold: n*U less everything leaked since it was
    -- made, and never more than the level (see token_bucket.rs for why this is safe). n*U
    -- or the leak may not be exact when huge, but each is then beyond the level all the
    -- same.
    local held = n * U - math.max(now - booked_at, 0) * lambda
    if u0 == 0 or held <= 0 then
      return {0, now}
    end
    level = u0 - math.min(u0, held)
    updated = now
    save()
    hset(key, 'r', refund_remember(refunds, refund_id))
    return {1, now}
  end
end

-- The level a spread cost starts from, as check() reads u0: the level at the spread's start
-- (never before t) less what leaked since; negative when the bucket would have emptied.
local function spent_from()
  local start = math.min(math.max(now - spread, updated), now)
  local at_start = level - math.max(start - updated, 0) * lambda
  if at_start < 0 then
    at_start = 0
  end
  return at_start - (now - start) * lambda
end

-- Returns allowed, remaining, reset_ms, booked. Comparisons are written as u0 <= C - n*U so
-- that no intermediate exceeds 2^53 (u0 itself may reach 2^53 under consume).
local function check(book_on_deny)
  if n > B and not book_on_deny and spread == 0 then
    -- Can never fit: no write. Under consume it is booked as any denial is.
    return false, 0, cdiv(u0, lambda), false
  end
  if spread > 0 then
    -- What is left of the spread cost may be nothing: the level is then 0.
    u0 = spent_from()
    if u0 + n * U < 0 then
      u0 = -n * U
    end
  end
  local room = C - n * U
  if u0 <= room then
    level = u0 + n * U
    updated = now
    return true, math.floor((C - level) / U), cdiv(level, lambda), true
  end
  -- Past one period the wait is the debt's, whatever the cost asked. A cost over twice the
  -- burst is past it whatever the level, and n*U may then be inexact: C says it exactly.
  local reset
  if n > 2 * B then
    reset = cdiv(C, lambda)
  else
    reset = cdiv(math.min(u0 - room, C), lambda)
  end
  if book_on_deny then
    -- Debt has an end: a cost-1 request fits again within one period (token_bucket.rs).
    level = math.min(u0 + n * U, 2 * C - U, MAX)
    updated = now
  end
  return false, 0, reset, book_on_deny
end

-- A cost-1 probe that books nothing: allowed, remaining, reset_ms.
local function peek()
  if u0 <= C - U then
    return true, math.floor((C - u0) / U), cdiv(u0, lambda)
  end
  return false, 0, cdiv(u0 - (C - U), lambda)
end
