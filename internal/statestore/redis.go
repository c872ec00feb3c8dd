package statestore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a Store in a Redis server, shared by replicas behind a proxy.
// Each of Claim, Put, Release and Delete is one Lua script, so atomic.
//
// Keys, for a session ID (the hash tag keeps a session's keys together):
//
//	wt:{ID}:rec    hash: the record's fields ("f:NAME") and its holder
//	               ("m:owner", "m:replica", "m:boot"); expires after the
//	               claim's or last Put's TTL, as Memory's record does.
//	wt:{ID}:fence  the fence counter; expires FenceTTL (at least) after the
//	               record was last claimed or written, so that a stale
//	               owner stays fenced after the record itself expired.
//	wt:owner:R/B   one owner's heartbeat (replica R, boot B, path-escaped).
//
// A Claim reads the holder's heartbeat key from inside its script, a key
// in another slot: the store needs one Redis server (or a primary with
// replicas, or Sentinel), not Redis Cluster. Redis itself is not a
// security control here: whoever reaches it can delete sessions; values
// are sealed by [Open] but names and fences are plain.
//
// Every call returns when ctx ends (a deadline or a cancellation; the
// call may still take effect in Redis, as any call whose reply is lost)
// and has the client's own bounds too: 3 s to dial, 5 s to read or write
// a reply, a pool of 8 connections per process, one retry after a network
// error (each script is safe to run twice).
type Redis struct {
	c      *redis.Client
	closed atomic.Bool
}

// FenceTTL is the least time a Redis session's fence counter outlives the
// session's last claim or write (it is the record's TTL when that is
// longer). A stale owner that comes back after more than that could find
// the counter restarted; a replica paused for a day is not expected.
const FenceTTL = 24 * time.Hour

// NewRedis connects to the server at url, redis://[user:pass@]HOST:PORT/DB
// (or rediss:// for TLS), and checks it answers. The caller closes it.
func NewRedis(url string) (*Redis, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("statestore: redis URL: %v", err)
	}
	opt.DialTimeout = 3 * time.Second
	opt.ReadTimeout = 5 * time.Second
	opt.WriteTimeout = 5 * time.Second
	opt.ContextTimeoutEnabled = true
	opt.PoolSize = 8
	opt.MaxRetries = 1
	opt.DisableIdentity = true // no CLIENT SETINFO: older servers refuse it noisily
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("statestore: redis %s: %v", opt.Addr, err)
	}
	return &Redis{c: c}, nil
}

func recKey(id string) string   { return "wt:{" + id + "}:rec" }
func fenceKey(id string) string { return "wt:{" + id + "}:fence" }
func ownerKey(o Owner) string {
	return "wt:owner:" + url.PathEscape(o.Replica) + "/" + url.PathEscape(o.Boot)
}

// ms is d in whole milliseconds, at least 1 (PX refuses 0).
func ms(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

func fenceMS(ttl time.Duration) int64 { return ms(max(ttl, FenceTTL)) }

// call checks ctx and the store's state, runs f, and maps the client's
// errors. The client bounds a reply's wait by ctx's deadline but does not
// notice a cancellation; call returns at once on either, leaving f to end
// in the background (within the client's read timeout). f must not write
// what its caller reads after an error.
func (r *Redis) call(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.closed.Load() {
		return ErrClosed
	}
	done := make(chan error, 1)
	go func() { done <- f() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	switch {
	case err == nil || errors.Is(err, redis.Nil):
		return nil
	case errors.Is(err, redis.ErrClosed) || r.closed.Load():
		return ErrClosed
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("statestore: redis: %w", err)
}

func (r *Redis) Heartbeat(ctx context.Context, owner Owner, ttl time.Duration) error {
	return r.call(ctx, func() error {
		return r.c.Set(ctx, ownerKey(owner), "1", time.Duration(ms(ttl))*time.Millisecond).Err()
	})
}

func (r *Redis) Leave(ctx context.Context, owner Owner) error {
	return r.call(ctx, func() error { return r.c.Del(ctx, ownerKey(owner)).Err() })
}

// claimScript: KEYS rec, fence; ARGV owner key, replica, boot, ttl ms,
// fence ttl ms, steal. Returns {0, fence} (held already), {1, replica,
// boot} (held by a live owner), or {2, fence, prev replica, prev boot,
// prev alive}. Like Memory, every claim renews the record's TTL.
var claimScript = redis.NewScript(`
local rec, fk = KEYS[1], KEYS[2]
local h = redis.call('HMGET', rec, 'm:owner', 'm:replica', 'm:boot')
if redis.call('EXISTS', rec) == 1 then redis.call('PEXPIRE', rec, ARGV[4]) end
if h[1] == ARGV[1] then
  redis.call('PEXPIRE', fk, ARGV[5])
  return {0, tonumber(redis.call('GET', fk) or '0')}
end
local pr, pb, alive = '', '', 0
if h[1] and h[1] ~= '' then
  alive = redis.call('EXISTS', h[1])
  if alive == 1 and ARGV[6] ~= '1' then return {1, h[2], h[3]} end
  pr, pb = h[2], h[3]
end
local fence = redis.call('INCR', fk)
redis.call('PEXPIRE', fk, ARGV[5])
redis.call('HSET', rec, 'm:owner', ARGV[1], 'm:replica', ARGV[2], 'm:boot', ARGV[3])
redis.call('PEXPIRE', rec, ARGV[4])
return {2, fence, pr, pb, alive}
`)

func (r *Redis) Claim(ctx context.Context, id string, owner Owner, ttl time.Duration, steal bool) (Claim, error) {
	var res []any
	err := r.call(ctx, func() (err error) {
		res, err = claimScript.Run(ctx, r.c, []string{recKey(id), fenceKey(id)},
			ownerKey(owner), owner.Replica, owner.Boot, ms(ttl), fenceMS(ttl), steal).Slice()
		return err
	})
	if err != nil {
		return Claim{}, err
	}
	str := func(i int) string { s, _ := res[i].(string); return s }
	num := func(i int) uint64 { n, _ := res[i].(int64); return uint64(n) }
	switch {
	case len(res) == 2 && num(0) == 0:
		return Claim{Fence: num(1)}, nil
	case len(res) == 3 && num(0) == 1:
		return Claim{}, &HeldError{Holder: Owner{Replica: str(1), Boot: str(2)}}
	case len(res) == 5 && num(0) == 2:
		return Claim{Fence: num(1), Previous: Owner{Replica: str(2), Boot: str(3)}, PreviousAlive: num(4) == 1}, nil
	}
	return Claim{}, fmt.Errorf("statestore: redis: claim: unexpected reply %v", res)
}

// putScript: KEYS rec, fence; ARGV fence, field, value, ttl ms, fence ttl
// ms. Returns 1, or 0 when fenced (no holder, or another fence).
var putScript = redis.NewScript(`
local o = redis.call('HGET', KEYS[1], 'm:owner')
if not o or o == '' or redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
`)

func (r *Redis) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	if len(value) > MaxValue {
		return ErrTooLarge
	}
	var ok int64
	err := r.call(ctx, func() (err error) {
		ok, err = putScript.Run(ctx, r.c, []string{recKey(id), fenceKey(id)},
			strconv.FormatUint(fence, 10), "f:"+field, value, ms(ttl), fenceMS(ttl)).Int64()
		return err
	})
	if err == nil && ok != 1 {
		err = ErrFenced
	}
	return err
}

func (r *Redis) Get(ctx context.Context, id string) (map[string][]byte, error) {
	var all map[string]string
	err := r.call(ctx, func() (err error) {
		all, err = r.c.HGetAll(ctx, recKey(id)).Result()
		return err
	})
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for k, v := range all {
		if name, ok := strings.CutPrefix(k, "f:"); ok {
			out[name] = []byte(v)
		}
	}
	if len(out) == 0 {
		return nil, ErrNotFound
	}
	return out, nil
}

// releaseScript: KEYS rec, fence; ARGV fence. The holder is blanked, not
// removed, so the record (its fields, its TTL) stays as it was.
var releaseScript = redis.NewScript(`
local o = redis.call('HGET', KEYS[1], 'm:owner')
if o and o ~= '' and redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('HSET', KEYS[1], 'm:owner', '', 'm:replica', '', 'm:boot', '')
end
return 1
`)

func (r *Redis) Release(ctx context.Context, id string, fence uint64) error {
	return r.call(ctx, func() error {
		return releaseScript.Run(ctx, r.c, []string{recKey(id), fenceKey(id)}, strconv.FormatUint(fence, 10)).Err()
	})
}

// deleteScript: KEYS rec, fence; ARGV fence, fence ttl ms. Returns 1, or
// 0 when fenced. The record is emptied but kept until it would have
// expired, as Memory does; the fence stays.
var deleteScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 1 end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
local pttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'm:owner', '', 'm:replica', '', 'm:boot', '')
if pttl > 0 then redis.call('PEXPIRE', KEYS[1], pttl) end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
`)

func (r *Redis) Delete(ctx context.Context, id string, fence uint64) error {
	var ok int64
	err := r.call(ctx, func() (err error) {
		ok, err = deleteScript.Run(ctx, r.c, []string{recKey(id), fenceKey(id)},
			strconv.FormatUint(fence, 10), fenceMS(0)).Int64()
		return err
	})
	if err == nil && ok != 1 {
		err = ErrFenced
	}
	return err
}

// Close closes the connections; calls in flight fail. It is idempotent.
func (r *Redis) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	return r.c.Close()
}
