--[[
floodgate: the shared head of every algorithm's call, run first on each call
(src/backend/redis/scripts.rs). It sets and checks the arguments every script takes (see each
script's header for ARGV): `key op n W L B consume lockout refund_id`, and ARGV[8]: for a refund
`booked_at`, for a charge `spread` (the ms before now its cost was spent over; 0 for a
request decided now). They are declared once with the algorithm, so that its functions, also defined
once, read them without a closure per call. `now` and the helpers (lua/lib.lua) are defined
before it, once per call of a script, or once at FUNCTION LOAD for the library. The assembled
text is written to target/lua-assembled/ by tests/lua.rs.
]]
key = KEYS[1]
op = ARGV[1]
n = tonumber(ARGV[2])
W = tonumber(ARGV[3])
L = tonumber(ARGV[4])
B = tonumber(ARGV[5])
consume = ARGV[6] == '1'
lockout = tonumber(ARGV[7])
refund_id = ARGV[9]
if op ~= 'charge' and op ~= 'refund' then
  return redis.error_reply('ERR floodgate ' .. ALGORITHM .. ': unknown op')
end
if not (n and W and L and B and lockout) or n < 0 or W < 1 or L < 1 or B < 1 or lockout < 0 then
  return redis.error_reply('ERR floodgate ' .. ALGORITHM .. ': bad arguments')
end
if op == 'charge' then
  spread = tonumber(ARGV[8]) or 0
  if spread < 0 or spread > 3600000 then
    return redis.error_reply('ERR floodgate ' .. ALGORITHM .. ': bad spread')
  end
end
if op == 'refund' then
  if not (refund_id and string.match(refund_id, '^%d+$') and #refund_id <= 20) then
    return redis.error_reply('ERR floodgate ' .. ALGORITHM .. ': bad refund id')
  end
  booked_at = tonumber(ARGV[8])
  if not booked_at then
    return redis.error_reply('ERR floodgate ' .. ALGORITHM .. ': bad booked_at')
  end
end
