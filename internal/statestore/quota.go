package statestore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// Quota is what a write counts against in a store that counts its
// tenants' bytes itself ([Counts]): the tenant whose bytes the record is
// (its fields' values, sealed, as stored), that tenant's budget and every
// tenant's together. A store that processes share counts there what they
// write, so that a tenant's share holds across replicas: counted in each
// replica's memory, with R replicas a tenant stored R times its share.
type Quota struct {
	Tenant string // "" counts nothing
	// Assumed says the caller does not know whose the record is, and
	// Tenant is a guess: a record counted as a tenant's already stays
	// that tenant's (a replica that took a session over may write it
	// before a request says whose it is).
	Assumed bool
	// PerTenant and Total are the budgets in bytes; 0 bounds nothing.
	PerTenant, Total int64
}

type quotaKey struct{}

// WithQuota returns ctx with q: a Put under it counts the record against
// q, in a store that [Counts], and fails with a *BudgetError past it.
// Other stores ignore it.
func WithQuota(ctx context.Context, q Quota) context.Context {
	return context.WithValue(ctx, quotaKey{}, q)
}

type replacingKey struct{}

// Replacing returns ctx for a write that its writer follows with a write
// of field of the same record replacing its value (internal/durable: a
// state written whole, then its new base): a budget check of the write
// ([WithQuota]) does not count field's bytes, about to go. Counted, they
// would refuse for good a state of more than half a tenant's share
// written whole beside its old base. The write still counts them until
// they go.
func Replacing(ctx context.Context, field string) context.Context {
	return context.WithValue(ctx, replacingKey{}, field)
}

func replacingOf(ctx context.Context) string {
	f, _ := ctx.Value(replacingKey{}).(string)
	return f
}

func quotaOf(ctx context.Context) Quota {
	if ctx.Value(uncountedKey{}) != nil {
		return Quota{}
	}
	q, _ := ctx.Value(quotaKey{}).(Quota)
	return q
}

type uncountedKey struct{}

// uncounted returns ctx for a write of a record that is no tenant's (the
// store's key check, [CheckKey]): it counts nothing, whatever quota the
// wrappers it passes through put on it ([WithQuota]) after. Counted, the
// host's wrapper made the check the anonymous pool's (every record not
// yet said to be another tenant's is), its bytes in that pool's share
// and that pool's count key kept for the check's 365 days.
func uncounted(ctx context.Context) context.Context {
	return context.WithValue(ctx, uncountedKey{}, true)
}

// Counts reports whether s counts tenants' bytes itself ([WithQuota]):
// Redis, plain or sealed. Memory and File do not: one process holds a
// File's every claim, and its caller counts what it writes.
func Counts(s Store) bool {
	switch s := s.(type) {
	case *Redis:
		return true
	case *sealed:
		return Counts(s.Store)
	}
	return false
}

// ErrBudget matches a [*BudgetError].
var ErrBudget = errors.New("statestore: byte budget exceeded")

// BudgetError is a write refused by a budget of its [Quota]: the store
// is as it was.
type BudgetError struct {
	Tenant bool  // the tenant's budget; else the total
	Budget int64 // its bytes
}

func (e *BudgetError) Error() string {
	if e.Tenant {
		return fmt.Sprintf("statestore: this client's subject's records would hold more than its share, %d bytes, in the store", e.Budget)
	}
	return fmt.Sprintf("statestore: the store's records would hold more than the %d bytes they may", e.Budget)
}

func (e *BudgetError) Is(target error) bool { return target == ErrBudget }

// Redis counts a tenant's bytes in keys of its own (not Redis Cluster,
// as the claim's heartbeat read already requires):
//
//	wt:q:TENANT  hash: record ID -> the bytes counted for it, and " sum",
//	             their sum; " c", where the last reconcile stopped. Its
//	             TTL is renewed to the record's by every script that
//	             renews a record of the tenant's (its writes, renewals,
//	             claims), so it lives as long as the last of them.
//	wt:q         hash: TENANT -> that tenant's " sum" as last seen (a
//	             tenant's hash may expire: its sum goes with it, and the
//	             total is corrected by the difference), " total", their
//	             sum, and " c", where the last reconcile of every tenant
//	             stopped. No TTL.
//
// A record says whose it is and its bytes ("m:t", "m:bytes"), so that a
// write counts the difference it makes, a claim or renewal finds the
// tenant's hash, and a reconcile finds counts that outlived their record:
// expired, evicted, deleted, or counted as another tenant's since. A write
// past a budget reconciles first (the tenant's counts, or for the total
// every tenant's), at most pruneLimit entries a script from where the last
// one stopped, so a stale count refuses a few writes at most, never for
// good, and no script runs long. Redis that comes back empty lost the
// counts with the records. Under an allkeys eviction policy "wt:q" may be
// evicted: the total then counts only what the tenants write after it
// (fewer bytes, never more).
const quotaFuncs = `
local function quotaKey(tenant) return 'wt:q:' .. tenant end
local function recOf(id) return 'wt:{' .. id .. '}:rec' end
local function recID(rec) return string.sub(rec, 5, -6) end
local function extendQuota(tenant, ttl)
  if tenant and tenant ~= '' then redis.call('PEXPIRE', quotaKey(tenant), ttl) end
end
local function quotaFields(q)
  if not q or (q.was == q.tenant and q.had == q.bytes) then return {} end
  return {'m:t', q.tenant, 'm:bytes', q.bytes}
end
local function adjust(tenant, d)
  if d == 0 then return end
  local sum = redis.call('HINCRBY', quotaKey(tenant), ' sum', d)
  local mirror = tonumber(redis.call('HGET', 'wt:q', tenant) or '0')
  redis.call('HSET', 'wt:q', tenant, sum)
  redis.call('HINCRBY', 'wt:q', ' total', sum - mirror)
end
local function reconcile(tenant, limit)
  local key = quotaKey(tenant)
  local cur = redis.call('HGET', key, ' c') or '0'
  local freed, seen = 0, 0
  repeat
    local r = redis.call('HSCAN', key, cur, 'COUNT', 128)
    cur = r[1]
    for i = 1, #r[2], 2 do
      local id = r[2][i]
      if string.sub(id, 1, 1) ~= ' ' then
        seen = seen + 1
        local m = redis.call('HMGET', recOf(id), 'm:t', 'm:bytes')
        local now, was = 0, tonumber(r[2][i + 1])
        if m[1] == tenant then now = tonumber(m[2] or '0') end
        if now ~= was then
          if now == 0 then redis.call('HDEL', key, id) else redis.call('HSET', key, id, now) end
          freed = freed + was - now
        end
      end
    end
  until cur == '0' or seen >= limit
  if redis.call('EXISTS', key) == 1 then
    if cur == '0' then redis.call('HDEL', key, ' c') else redis.call('HSET', key, ' c', cur) end
  end
  adjust(tenant, -freed)
  return seen
end
local function reconcileAll(limit)
  local cur = redis.call('HGET', 'wt:q', ' c') or '0'
  local seen = 0
  repeat
    local r = redis.call('HSCAN', 'wt:q', cur, 'COUNT', 128)
    cur = r[1]
    for i = 1, #r[2], 2 do
      local tenant = r[2][i]
      if string.sub(tenant, 1, 1) ~= ' ' and seen < limit then
        seen = seen + 1
        if redis.call('EXISTS', quotaKey(tenant)) == 0 then
          local mirror = tonumber(redis.call('HGET', 'wt:q', tenant) or '0')
          redis.call('HDEL', 'wt:q', tenant)
          redis.call('HINCRBY', 'wt:q', ' total', -mirror)
        else
          seen = seen + reconcile(tenant, limit - seen)
        end
      end
    end
  until cur == '0' or seen >= limit
  if cur == '0' then redis.call('HDEL', 'wt:q', ' c') else redis.call('HSET', 'wt:q', ' c', cur) end
end
`

// pruneLimit bounds the counts one write's reconcile examines: a few
// hundred µs of Redis's time, which it gives no other client meanwhile.
// A tenant past its budget pays it at each write it makes (its calls'
// checkpoints, and the keeper's resaves of their states), so it is kept
// to the order of what a call costs the host; stale counts beyond it go
// at the next writes. (Redis scans a small hash, kept as a listpack, up
// to hash-max-listpack-entries, 512 by default, in one step: a step of
// such a hash examines all of it.)
const pruneLimit = 128

// quotaCheck is the budget step of a write's script (writeScript), after
// its fence and version checks: ARGV[11] the tenant ("" counts nothing),
// ARGV[12] its budget, ARGV[13] the total's (0: none), ARGV[14] the
// value's bytes, ARGV[15] a field whose bytes the check does not count
// ([Replacing]; "" none), ARGV[16] "1" when the tenant is assumed (the
// record's own, if it has one, wins); h is checkRecord's (h[8] the record's tenant, h[9] its
// bytes), values checkValues'. It sets q, what quotaSettle counts after
// the write, or returns 7 (the tenant's budget) or 8 (the total's).
var quotaCheck = `
if ARGV[11] and ARGV[11] ~= '' then
  local tenant = ARGV[11]
  if ARGV[16] == '1' and h[8] and h[8] ~= '' then tenant = h[8] end
  local far = false
  for _, k in ipairs(values) do far = far or k == KEYS[4] end
  local old
  if far then old = redis.call('STRLEN', KEYS[4]) else old = redis.call('HSTRLEN', KEYS[1], ARGV[3]) end
  q = {tenant = tenant, id = recID(KEYS[1]), key = quotaKey(tenant), was = h[8], had = tonumber(h[9] or '0')}
  q.bytes = math.max(q.had - old + tonumber(ARGV[14]), 0)
  local function read()
    local t = redis.call('HMGET', q.key, q.id, ' sum')
    local a = redis.call('HMGET', 'wt:q', tenant, ' total')
    q.entry, q.sum = tonumber(t[1] or '0'), tonumber(t[2] or '0')
    q.mirror, q.total = tonumber(a[1] or '0'), tonumber(a[2] or '0')
    q.freed = 0
    if q.was and q.was ~= tenant then q.freed = tonumber(redis.call('HGET', quotaKey(q.was), q.id) or '0') end
  end
  local excused = 0
  if ARGV[15] and ARGV[15] ~= '' then
    local vk = string.sub(KEYS[1], 1, -4) .. 'v:' .. ARGV[15]
    local farther = false
    for _, k in ipairs(values) do farther = farther or k == vk end
    if farther then excused = redis.call('STRLEN', vk) else excused = redis.call('HSTRLEN', KEYS[1], 'f:' .. ARGV[15]) end
  end
  local per, all = tonumber(ARGV[12]), tonumber(ARGV[13])
  local function over()
    local d = q.bytes - q.entry
    if d <= 0 then return nil end
    d = d - excused
    if per > 0 and q.sum + d > per then return 7 end
    if all > 0 and q.total - q.mirror + q.sum + d - q.freed > all then return 8 end
  end
  read()
  local code = over()
  if code == 7 then reconcile(tenant, ` + strconv.Itoa(pruneLimit) + `); read(); code = over() end
  if code == 8 then reconcileAll(` + strconv.Itoa(pruneLimit) + `); read(); code = over() end
  if code then return code end
end
`

// quotaSettle counts what quotaCheck let through, once written (the
// write's own HSET sets the record's quotaFields). The total is set from
// what quotaCheck read, in the same atomic step, unless the record moved
// from another tenant, whose count (adjust) changed it since.
const quotaSettle = `
if q then
  if q.was and q.was ~= q.tenant then
    redis.call('HDEL', quotaKey(q.was), q.id)
    adjust(q.was, -q.freed)
  end
  local d = q.bytes - q.entry
  if d ~= 0 or q.sum ~= q.mirror then
    local sum = q.sum + d
    redis.call('HSET', q.key, q.id, q.bytes, ' sum', sum)
    if q.was and q.was ~= q.tenant then
      redis.call('HSET', 'wt:q', q.tenant, sum)
      redis.call('HINCRBY', 'wt:q', ' total', sum - q.mirror)
    else
      redis.call('HSET', 'wt:q', q.tenant, sum, ' total', q.total - q.mirror + sum)
    end
  end
  redis.call('PEXPIRE', q.key, ARGV[5])
end
`
