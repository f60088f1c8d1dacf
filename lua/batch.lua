--[[
floodgate: many requests' charges in one script call, each request all-or-nothing.

Loaded by src/backend/redis/scripts.rs after a table ALGORITHMS whose entries 1..4 (fixed_window,
token_bucket, sliding_window, sliding_log, the order of `Algorithm::ALL`) are the algorithm
scripts, each wrapped as a function(KEYS, ARGV) that returns that script's reply.

KEYS     every item's bucket, in item order across all groups
ARGV[1]  the words below, one string of 8-byte little-endian signed integers (struct.pack
         'i8's): Redis parses one argument rather than a few per item, and no word is read
         from decimal.
G: the number of groups (requests)
P: the number of distinct policies the items use, each sent once
then per policy, 10 values:
  algorithm  1..4, the index in ALGORITHMS
  quota      1 = a quota_mode rule
  shadow     1 = a shadow_mode rule (its denial never rejects the request)
  W L B consume lockout   as ARGV[3..7] of the algorithm scripts
  spread     as ARGV[8] of a charge
  lease      0, or for a global rule (scope: global) 1 + its region's base lease: the item
             decides with the lease its region holds, field `l` of `<key>:lease:<L>`
             (lua/lease.lua: a changed limit starts again from the bases), the base while
             there is none; B scaled alike. A lease under 1 denies, booking nothing.
then per group:
  m          its item count, written -m when 4 values of verdicts known without Redis follow:
    admit    1 = the request is admitted whatever it decides (global shadow mode)
    over     1 = a non-quota rule of the request already denied without the backend
    qtotal   quota rules of the request decided without the backend
    qover    of those, how many denied
  then per item, 2 values: its policy (1..P) and n, its cost

Reply: one string of 8-byte little-endian signed integers (struct.pack): now_ms (the one
clock reading of the call), then 3 per item, in item order: {state, remaining, reset_ms},
state = allowed + 2 booked + 4 rolled_back (each 0|1), or, for every item of a group whose
charge failed (a key overwritten with another type answers WRONGTYPE, say): {-1, 0, 0}. One
string rather than an array of integers: the client reads it with no per-integer parsing. Errors are per group: the failing call is caught
(pcall), the group's bookings made so far are undone here, and the other groups of the
batch are decided as if it were not there.

A bucket decided more than once is read once and written once, at the end (the cache of
lua/lib.lua).

A group is rejected when a non-quota rule denies or every quota rule denies (`Tally` in
src/backend/mod.rs). A rejected group's bookings made under `reject` are undone right away by
the algorithm's own refund at the booking's instant (refund id 0: never re-sent, so not
recorded), inside this one atomic script, so no other client ever sees them: nothing is
booked for a rejected request.
]]

local out = {now}
local key = 1

-- The buckets this call decides more than once go through the cache of lua/lib.lua.
local seen = {}
for i = 1, #KEYS do
  if seen[KEYS[i]] then
    repeated[KEYS[i]] = true
  end
  seen[KEYS[i]] = true
end

local packed = ARGV[1]
if type(packed) ~= 'string' or #packed == 0 or #packed % 8 ~= 0 then
  return redis.error_reply('ERR floodgate batch: bad words')
end
-- Every word, then (struct.unpack's last value) the position after them.
local words = {struct.unpack('<' .. string.rep('i8', #packed / 8), packed)}

-- The policies, read once.
local policies = {}
local arg = 3
for p = 1, words[2] do
  local run = ALGORITHMS[words[arg]]
  if not run then
    return redis.error_reply('ERR floodgate batch: unknown algorithm')
  end
  policies[p] = {run = run, quota = words[arg + 1] == 1, shadow = words[arg + 2] == 1,
    W = words[arg + 3], L = words[arg + 4], B = words[arg + 5],
    consume = words[arg + 6] == 1 and '1' or '0', lockout = words[arg + 7],
    spread = string.format('%d', words[arg + 8]), lease = words[arg + 9]}
  arg = arg + 10
end

-- One KEYS table and one ARGV table carry every charge: an algorithm reads its arguments
-- into locals before anything else, so they are refilled for the next item instead of
-- built anew (a batch's cost in Redis is mostly allocation).
local charge_keys = {}
local charge_args = {'charge', 0, 0, 0, 0, '0', 0, '0', '0'}

-- The limit and burst bucket KEYS[key] decides with under policy: a global rule's from its
-- region's lease (the lease and the bucket share one hash tag, so one slot).
local function limits(policy, key)
  if policy.lease == 0 then
    return policy.L, policy.B
  end
  local lease = tonumber(redis.call('HGET', KEYS[key] .. ':lease:' .. policy.L, 'l'))
    or (policy.lease - 1)
  lease = math.min(lease, policy.L)
  return lease, math.floor(policy.B * lease / policy.L)
end

-- Charges bucket KEYS[key] with cost n under policy, with limit l and burst b: pcall's ok
-- and the algorithm's reply (a lease of nothing denies without a call).
local function charge(policy, key, n, l, b)
  if l < 1 or b < 1 then
    return true, {0, 0, policy.W, now, 0}
  end
  charge_keys[1] = KEYS[key]
  charge_args[2], charge_args[3], charge_args[4] = n, policy.W, l
  charge_args[5], charge_args[6], charge_args[7] = b, policy.consume, policy.lockout
  charge_args[8] = policy.spread
  return pcall(policy.run, charge_keys, charge_args)
end

-- Undoes the booking that reply reports for bucket KEYS[key] (cost n, under policy with
-- limit l and burst b) at its instant (refund id 0), when it made one under reject.
local function undo(policy, key, n, l, b, reply)
  if reply[1] == 1 and reply[5] == 1 and n ~= 0 and policy.consume ~= '1' then
    local ok, undone = pcall(policy.run, {KEYS[key]}, {'refund', n, policy.W, l,
      b, policy.consume, policy.lockout, string.format('%d', reply[4]), '0'})
    return ok and not undone.err
  end
  return false
end

-- Item i of the group whose words start at words[first_arg] and keys at KEYS[first_key]: its
-- policy (nil if unknown), the index of its key and its cost.
local function item(first_arg, first_key, i)
  local at = first_arg + 2 * (i - 1)
  return policies[words[at]], first_key + i - 1, words[at + 1]
end

-- The replies of the current group's items, in order, and the limit and burst each
-- decided with (reused by every group).
local replies, ls, bs = {}, {}, {}

for _ = 1, words[1] do
  local m = words[arg]
  local admit, over, qtotal, qover = false, false, 0, 0
  if m < 0 then
    m = -m
    admit = words[arg + 1] == 1
    over = words[arg + 2] == 1
    qtotal = words[arg + 3]
    qover = words[arg + 4]
    arg = arg + 4
  end
  arg = arg + 1
  -- Where the group's items start, to find an item's policy, key and cost again.
  local first_arg, first_key = arg, key
  local decided = 0
  for i = 1, m do
    local policy, at, n = item(first_arg, first_key, i)
    if not policy then
      return redis.error_reply('ERR floodgate batch: unknown policy')
    end
    local ok, l, b = pcall(limits, policy, at)
    local reply
    if ok then
      ok, reply = charge(policy, at, n, l, b)
    end
    if not ok or reply.err then
      break
    end
    replies[i], ls[i], bs[i] = reply, l, b
    decided = i
    local denied = reply[1] == 0 and not policy.shadow
    if policy.quota then
      qtotal = qtotal + 1
      if denied then
        qover = qover + 1
      end
    elseif denied then
      over = true
    end
  end
  arg = first_arg + 2 * m
  key = first_key + m
  if decided < m then
    -- This request fails alone: its other items are skipped, what it booked is undone.
    for i = 1, decided do
      local policy, at, n = item(first_arg, first_key, i)
      undo(policy, at, n, ls[i], bs[i], replies[i])
    end
    for _ = 1, m do
      out[#out + 1] = -1
      out[#out + 1] = 0
      out[#out + 1] = 0
    end
  else
    local rejected = not admit and (over or (qtotal > 0 and qover == qtotal))
    for i = 1, m do
      local reply = replies[i]
      local rolled_back = 0
      -- Undoable: it fitted and booked a positive cost under reject (not consume).
      if rejected then
        local policy, at, n = item(first_arg, first_key, i)
        if undo(policy, at, n, ls[i], bs[i], reply) then
          reply[5] = 0
          rolled_back = 1
        end
      end
      out[#out + 1] = reply[1] + 2 * reply[5] + 4 * rolled_back
      out[#out + 1] = reply[2]
      out[#out + 1] = reply[3]
    end
  end
end
flush()
return struct.pack('<' .. string.rep('i8', #out), unpack(out))
