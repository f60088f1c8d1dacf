--[[
floodgate: the shared head of every algorithm script, prepended to each when it is loaded
(src/backend/redis/scripts.rs), after a line that sets ALGORITHM to the script's name. It reads
and checks the arguments every script takes (see each script's header for ARGV). `now` and the
helpers (lua/lib.lua) are defined before it, once per call of a script, or once at FUNCTION
LOAD for the library. The assembled text is written to target/lua-assembled/ by tests/lua.rs.
]]
local key = KEYS[1]
local op = ARGV[1]
local n = tonumber(ARGV[2])
local W = tonumber(ARGV[3])
local L = tonumber(ARGV[4])
local B = tonumber(ARGV[5])
local consume = ARGV[6] == '1'
local lockout = tonumber(ARGV[7])
local refund_id = ARGV[9]
if op ~= 'charge' and op ~= 'refund' then
  return redis.error_reply('ERR floodgate ' .. ALGORITHM .. ': unknown op')
end
if not (n and W and L and B and lockout) or n < 0 or W < 1 or L < 1 or B < 1 or lockout < 0 then
  return redis.error_reply('ERR floodgate ' .. ALGORITHM .. ': bad arguments')
end
if op == 'refund' and not (refund_id and string.match(refund_id, '^%d+$') and #refund_id <= 20) then
  return redis.error_reply('ERR floodgate ' .. ALGORITHM .. ': bad refund id')
end
