--[[
floodgate: the shared tail of every algorithm's call, run after the shared head
(lua/prelude.lua) and the algorithm's load() (src/backend/redis/scripts.rs). It is the order
of Bucket::decide in src/algorithm/mod.rs: a peek changes nothing; an active lock denies
(booking the cost only under consume); then the algorithm decides, and a real denial starts
the lockout.

The algorithm defines, once, beside the arguments of the head:
  locked                              the lock of the bucket load() read
  check(book_on_deny)                 -> allowed, remaining, reset_ms, booked
  peek()                              -> allowed, remaining, reset_ms (no write)
  save()                              writes the state, `locked` included, with its expiry
]]

local function reply(allowed, remaining, reset_ms, booked)
  return {allowed and 1 or 0, remaining, reset_ms, now, booked and 1 or 0}
end

if n == 0 then
  if locked > now then
    return reply(false, 0, locked - now, false)
  end
  local allowed, remaining, reset_ms = peek()
  return reply(allowed, remaining, reset_ms, false)
end
if locked > now then
  local booked = false
  if consume then
    local _, _, _, b = check(true)
    booked = b
  end
  if booked then
    save()
  end
  return reply(false, 0, locked - now, booked)
end
local allowed, remaining, reset_ms, booked = check(consume)
local write = booked
if not allowed and lockout > 0 then
  locked = now + lockout
  reset_ms = lockout
  write = true
end
if write then
  save()
end
return reply(allowed, remaining, reset_ms, booked)
