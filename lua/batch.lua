--[[
floodgate: many requests' charges in one script call, each request all-or-nothing.

Loaded by src/backend/redis/scripts.rs after a table ALGORITHMS whose entries 1..4 (fixed_window,
token_bucket, sliding_window, sliding_log, the order of `Algorithm::ALL`) are the algorithm
scripts, each wrapped as a function(KEYS, ARGV) that returns that script's reply.

KEYS     every item's bucket, in item order across all groups
ARGV[1]  G: the number of groups (requests)
then per group, 5 values:
  admit      1 = the request is admitted whatever it decides (global shadow mode)
  over       1 = a non-quota rule of the request already denied without the backend
  qtotal     quota rules of the request decided without the backend
  qover      of those, how many denied
  m          the group's item count
then per item, 9 values:
  algorithm  1..4, the index in ALGORITHMS
  quota      1 = a quota_mode rule
  shadow     1 = a shadow_mode rule (its denial never rejects the request)
  n W L B consume lockout   as ARGV[2..7] of the algorithm scripts

A bucket decided more than once is read once and written once, at the end (the cache of
lua/lib.lua).

Reply: 6 integers per item, in item order:
  {allowed 0|1, remaining, reset_ms, now_ms, booked 0|1, rolled_back 0|1}
or, for every item of a group whose charge failed (a key overwritten with another type
answers WRONGTYPE, say): {-1, 0, 0, 0, 0, 0}. Errors are per group: the failing call is
caught (pcall), the group's bookings made so far are undone here, and the other groups of
the batch are decided as if it were not there.

A group is rejected when a non-quota rule denies or every quota rule denies (`Tally` in
src/backend/mod.rs). A rejected group's bookings made under `reject` are undone right away by
the algorithm's own refund at the booking's instant (refund id 0: never re-sent, so not
recorded), inside this one atomic script, so no other client ever sees them: nothing is
booked for a rejected request.
]]

local out = {}
local arg = 2
local key = 1

-- The buckets this call decides more than once go through the cache of lua/lib.lua.
local seen = {}
for i = 1, #KEYS do
  if seen[KEYS[i]] then
    repeated[KEYS[i]] = true
  end
  seen[KEYS[i]] = true
end

-- Undoes an item's booking at its instant (refund id 0), when it made one under reject.
local function undo(item)
  local reply = item.reply
  if reply[1] == 1 and reply[5] == 1 and item.args[2] ~= '0' and item.args[6] ~= '1' then
    local ok, undone = pcall(item.run, {item.key}, {'refund', item.args[2], item.args[3],
      item.args[4], item.args[5], item.args[6], item.args[7], string.format('%d', reply[4]),
      '0'})
    return ok and not undone.err
  end
  return false
end

for _ = 1, tonumber(ARGV[1]) do
  local admit = ARGV[arg] == '1'
  local over = ARGV[arg + 1] == '1'
  local qtotal = tonumber(ARGV[arg + 2])
  local qover = tonumber(ARGV[arg + 3])
  local m = tonumber(ARGV[arg + 4])
  arg = arg + 5
  local items = {}
  local failed = false
  for i = 1, m do
    local run = ALGORITHMS[tonumber(ARGV[arg])]
    if not run then
      return redis.error_reply('ERR floodgate batch: unknown algorithm')
    end
    local args = {'charge', ARGV[arg + 3], ARGV[arg + 4], ARGV[arg + 5], ARGV[arg + 6],
      ARGV[arg + 7], ARGV[arg + 8], '0', '0'}
    local ok, reply = pcall(run, {KEYS[key]}, args)
    if not ok or reply.err then
      -- This request fails alone: skip its other items, undo what it booked.
      failed = true
      arg = arg + 9 * (m - i + 1)
      key = key + (m - i + 1)
      break
    end
    local denied = reply[1] == 0 and ARGV[arg + 2] ~= '1'
    if ARGV[arg + 1] == '1' then
      qtotal = qtotal + 1
      if denied then
        qover = qover + 1
      end
    elseif denied then
      over = true
    end
    items[i] = {run = run, key = KEYS[key], args = args, reply = reply}
    arg = arg + 9
    key = key + 1
  end
  if failed then
    for i = 1, #items do
      undo(items[i])
    end
    for _ = 1, m do
      for _, value in ipairs({-1, 0, 0, 0, 0, 0}) do
        out[#out + 1] = value
      end
    end
  else
    local rejected = not admit and (over or (qtotal > 0 and qover == qtotal))
    for i = 1, m do
      local item = items[i]
      local reply = item.reply
      local rolled_back = 0
      -- Undoable: it fitted and booked a positive cost under reject (not consume).
      if rejected and undo(item) then
        reply[5] = 0
        rolled_back = 1
      end
      for j = 1, 5 do
        out[#out + 1] = reply[j]
      end
      out[#out + 1] = rolled_back
    end
  end
end
flush()
return out
