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
