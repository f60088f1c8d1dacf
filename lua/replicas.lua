--[[
floodgate: the replica registry (src/limiter/fallback/registry.rs). Each replica on a shared
Redis calls it once a heartbeat; it answers which replicas share the limits and the quota
service's fairness counters.

KEYS[1]  the registry: a sorted set, member = a replica's id, score = the server's ms at that
         replica's latest heartbeat
ARGV[1]  the replica's id
ARGV[2]  live_ms: a replica heard from within this long is live
ARGV[3]  grace_ms: a replica silent for longer is forgotten; until then it may be deciding
         from its own memory, cut off from this Redis, and its share stays reserved
ARGV[4]  1 = the replica leaves (graceful shutdown): it is removed at once
ARGV[5]  most silent ids answered
ARGV[6]  silent_ms: a silent replica is named while heard within this long (its counts of the
         quota service are gone from their windows past it)

Reply: {live, known, {silent ids}}: how many replicas were heard within live_ms and within
grace_ms (the caller included, unless it left), then the ids of those heard within silent_ms
but not within live_ms, at most ARGV[5], most recent first.
]]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local id, live_ms, grace_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local most, silent_ms = tonumber(ARGV[5]), tonumber(ARGV[6])
if not (live_ms and grace_ms and most and silent_ms) or live_ms < 1 or grace_ms < live_ms
  or most < 1 or silent_ms < live_ms then
  return redis.error_reply('ERR floodgate replicas: bad arguments')
end
if ARGV[4] == '1' then
  redis.call('ZREM', KEYS[1], id)
else
  redis.call('ZADD', KEYS[1], now, id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now - grace_ms))
redis.call('PEXPIRE', KEYS[1], 2 * grace_ms)
local since = string.format('%d', now - live_ms)
local named = string.format('%d', now - silent_ms)
return {redis.call('ZCOUNT', KEYS[1], since, '+inf'), redis.call('ZCARD', KEYS[1]),
  redis.call('ZREVRANGEBYSCORE', KEYS[1], '(' .. since, named, 'LIMIT', 0, most)}
