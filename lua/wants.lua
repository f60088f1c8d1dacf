--[[
floodgate: which global buckets a region is busy with (src/limiter/regions/wants.rs), so that
the other regions, which grant only from buckets they know, take part in them too.

KEYS[1]  a sorted set: member = a bucket and its policy (wants.rs), score = ms it was last busy
ARGV[1]  op: publish | read
ARGV[2]  horizon_ms: a member busy longer ago than this is dropped
ARGV[3]  most members kept
publish  ARGV[4..] the members busy now -> the set's size
read     -> the members busy within the horizon, most recent first, at most ARGV[3]
]]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local set, op, horizon, most = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if not (horizon and most) or horizon < 1 or most < 1 then
  return redis.error_reply('ERR floodgate wants: bad arguments')
end
local oldest = string.format('%d', now - horizon)
if op == 'publish' then
  for i = 4, #ARGV do
    redis.call('ZADD', set, now, ARGV[i])
  end
  redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. oldest)
  local size = redis.call('ZCARD', set)
  if size > most then
    redis.call('ZREMRANGEBYRANK', set, 0, size - most - 1)
  end
  redis.call('PEXPIRE', set, 2 * horizon)
  return redis.call('ZCARD', set)
end
if op == 'read' then
  return redis.call('ZREVRANGEBYSCORE', set, '+inf', oldest, 'LIMIT', 0, most)
end
return redis.error_reply('ERR floodgate wants: unknown op')
