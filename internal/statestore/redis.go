package statestore

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a Store in a Redis server, shared by replicas behind a proxy.
// Each of Claim, Put, Release and Delete is one Lua script, so atomic.
//
// Keys, for a session ID (the hash tag keeps a session's keys together):
//
//	wt:{ID}:rec    hash: the record's fields ("f:NAME") and its holder
//	               ("m:owner", "m:replica", "m:boot", "m:epoch", "m:n"),
//	               the write version and sealed head of [Seal] ("m:v",
//	               "m:head"), the last takeover's claim ID and answer
//	               ("m:cid", "m:pr", "m:pb", "m:pa": a claim sent again
//	               answers it again); expires after the claim's or last Put's
//	               TTL, as Memory's record does. A field whose value is
//	               kept out of line (below) has "o:NAME" beside it, and
//	               "f:NAME" holds [outOfLineMarker].
//	wt:{ID}:v:NAME the value of field NAME when it is outOfLine bytes or
//	               more; it expires with the record (every script that
//	               renews the record's TTL renews these keys').
//	wt:{ID}:s:RAND a value on its way to wt:{ID}:v:NAME: set in the same
//	               pipeline as the write's script, which renames it once
//	               the fence is checked, or deletes it; it expires after
//	               stageTTL if the script never ran.
//	wt:{ID}:lease  the holder's owner key, set by each of its claims,
//	               writes and renewals to expire after its [Lease]: a key
//	               of its own, so that a record the store drops (its
//	               value evicted: checkValues) does not take the lease
//	               with it; the claim reads it first.
//	wt:{ID}:fence  the fence counter; expires FenceTTL (at least) after the
//	               record was last claimed or written, so that a stale
//	               owner stays fenced after the record itself expired.
//	wt:owner:R/B   one owner's heartbeat (replica R, boot B, path-escaped).
//	wt:epoch       the store's epoch, part of every fence (epochKey).
//	wt:lost        that the store lost an earlier epoch, and when (lostKey).
//	wt:waited      written by an exchange sent again under WAIT, before
//	               its WAIT (waited); expires after a second.
//	wt:q:T, wt:q   the bytes of tenant T's records, and every tenant's
//	               sum: see [Quota] and quotaFuncs. A record's own
//	               "m:t" and "m:bytes" say whose it is and its bytes.
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
// a reply, a pool of 8 connections per process (and go-redis's 10 for
// pipelines), one retry after a network error (a dead pooled connection
// after Redis restarted; and the store's own: resend). A retry can
// resend a script whose reply was lost after Redis ran it: a versioned
// put or a fence bump sent again succeeds with what it did the first time
// (see putVersionedScripts and renewScript). A call that failed for want
// of an answer while or since the server refused or dropped a connection
// (since it last answered), or that it answered LOADING (on any attempt:
// the connections count it), is marked [ErrDropped].
type Redis struct {
	c     *redis.Client
	drops *drops // the connections the server refused or dropped
	// answered is drops' count when the latest exchange that the
	// server answered began: a failure is marked ErrDropped while the
	// count is past it (call).
	answered atomic.Uint64
	lease    time.Duration // [Lease] unless SetLease
	// wait is the replicas a write waits for (wait_replicas; 0: none),
	// up to waitTimeout: see waited.
	wait        int
	waitTimeout time.Duration
	loaded      sync.Map // of the *redis.Script run under WAIT (bySHA)
	closed      atomic.Bool
	// idle hands a call to a goroutine of an earlier one that waits
	// for another (call); quit ends them at Close.
	idle chan func()
	quit chan struct{}
}

// SetLease sets the lease a holder's exchanges give it ([Lease] by
// default; 0: none, for tests of anything else, whose owners take
// sessions from one another at once). Call it before the store is used.
func (r *Redis) SetLease(d time.Duration) { r.lease = d }

// FenceTTL is the least time a Redis session's fence counter outlives the
// session's last claim or write (it is the record's TTL when that is
// longer). A stale owner that comes back after more than that could find
// the counter restarted; a replica paused for a day is not expected.
const FenceTTL = 24 * time.Hour

// NewRedis connects to the server at url, redis://[user:pass@]HOST:PORT/DB
// (or rediss:// for TLS), or to the primary that the Sentinels at
// redis://SENTINEL:PORT/DB?master_name=NAME&addr=SENTINEL2:PORT... name
// (go-redis's failover URL: the userinfo is the Sentinels', the primary's
// the password= and username= parameters), and checks it answers. The
// caller closes it.
//
// wait_replicas=N (either form) makes every exchange that writes wait,
// after its command and on its connection, for N replicas to have what
// that connection wrote (Redis's WAIT), up to wait_timeout
// ([DefaultWaitTimeout], capped at 2/3 of what the exchange's deadline
// leaves): a write that fewer acknowledged fails with [ErrNotReplicated].
// Reads (Get, the head a sealed write reads) do not wait: one may see a
// write that a failover then loses, whose writer was not told it landed.
// Replication is asynchronous otherwise, and a failover to a replica
// that lagged loses writes the store acknowledged, fence bumps among them
// (docs/DESIGN.md, "Writes wait for replicas").
//
// Over rediss://, tls_ca_file=PATH names the CAs a server's certificate
// is checked against (else the system's), and tls_cert_file=PATH with
// tls_key_file=PATH the client certificate presented when a server asks
// for one (Redis's tls-auth-clients yes, its default); they are read
// again when they change on disk, at the next connection dialed (see
// tlsFiles; docs/DEPLOY.md, "Redis over TLS").
func NewRedis(url string) (*Redis, error) {
	cfg, err := parseRedisURL(url)
	if err != nil {
		return nil, err
	}
	return newRedis(cfg)
}

// newRedis is [NewRedis] with its URL parsed: a test sets what a URL
// cannot say (the CAs a TLS connection trusts).
func newRedis(cfg *redisConfig) (*Redis, error) {
	// One retry after a network error (a dead pooled connection after
	// Redis restarted), but none of go-redis's when writes wait for
	// replicas: a resend that finds its first send landed writes
	// nothing (the scripts' resent checks), and WAIT on the resend's
	// connection need not cover what the first send wrote. The store
	// sends such an exchange again itself, with a write before its
	// WAIT, when its connection was found closed (resend, as it does
	// past go-redis's one retry without WAIT); otherwise
	// the write fails for want of an answer, its outcome unknown, as
	// internal/durable handles.
	retries := 1
	if cfg.wait > 0 {
		retries = -1 // go-redis: -1 for none (0 is its default, 3)
	}
	d := &drops{}
	var (
		c     *redis.Client
		where string
		// asked: whether a server asked for a client certificate,
		// and was given one, which the error at open says: a
		// server's refusal of the certificate, or of none, arrives
		// after the handshake (TLS 1.3), as an alert or a
		// connection reset.
		asked atomic.Int32
	)
	if fo := cfg.failover; fo != nil {
		bound(&fo.DialTimeout, &fo.ReadTimeout, &fo.WriteTimeout, &fo.ContextTimeoutEnabled, &fo.DisableIdentity, &fo.PoolSize, &fo.MaxRetries, retries)
		// go-redis dials the primary (and each Sentinel it asks where
		// the primary is) through fo.Dialer. Its Sentinels' drops are
		// counted with the primary's: a drop marks an exchange failing
		// meanwhile ErrDropped, which only keeps a session on the
		// replica that holds it rather than hand it over
		// (internal/durable's ServeElsewhere), the cautious side; and
		// the Sentinels are asked only when a connection to the primary
		// is dialed, that is when the primary's was dropped or refused
		// already, or at a failover, when the primary may come back
		// older. Telling them apart would need the Sentinels' addresses,
		// which go-redis learns as it goes.
		fo.Dialer = d.dialer(storeDialer(fo.DialTimeout, fo.TLSConfig, cfg.tls, &asked))
		c = redis.NewFailoverClient(fo)
		where = fmt.Sprintf("primary %q through Sentinel %s", fo.MasterName, strings.Join(fo.SentinelAddrs, ", "))
	} else {
		opt := cfg.plain
		bound(&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.ContextTimeoutEnabled, &opt.DisableIdentity, &opt.PoolSize, &opt.MaxRetries, retries)
		opt.Dialer = d.dialer(storeDialer(opt.DialTimeout, opt.TLSConfig, cfg.tls, &asked))
		c = redis.NewClient(opt)
		where = opt.Addr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		if re := redis.Error(nil); !errors.As(err, &re) { // a server's answer says enough
			switch asked.Load() {
			case askedNone:
				err = fmt.Errorf("%v (the server asked for a client certificate, and the URL names none: tls_cert_file and tls_key_file)", err)
			case askedGiven:
				err = fmt.Errorf("%v (the server asked for a client certificate and was given tls_cert_file's: one it does not trust is refused after the handshake, as a reset or \"unknown certificate authority\")", err)
			}
		}
		return nil, fmt.Errorf("statestore: redis %s: %v", where, err)
	}
	return &Redis{c: c, drops: d, lease: Lease, wait: cfg.wait, waitTimeout: cfg.waitTimeout,
		idle: make(chan func()), quit: make(chan struct{})}, nil
}

// storeDialer is go-redis's dialer, with TLS (conf not nil) made by
// tlsPerHost: each server checked against its own address, the CAs and
// the client certificate read again when their files change. go-redis
// dials through its Dialer alone, so conf, in its options, only tells it
// the connections are TLS. A server asking for a client certificate
// sets asked (askedNone, askedGiven).
func storeDialer(timeout time.Duration, conf *tls.Config, files *tlsFiles, asked *atomic.Int32) dialFunc {
	dial := redis.NewDialer(&redis.Options{DialTimeout: timeout})
	if conf != nil {
		if get := conf.GetClientCertificate; get != nil || len(conf.Certificates) == 0 {
			conf = conf.Clone()
			conf.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
				if get == nil {
					asked.Store(askedNone)
					return &tls.Certificate{}, nil // none, as without the callback
				}
				asked.Store(askedGiven)
				return get(cri)
			}
		}
		dial = tlsPerHost(dial, conf, files, timeout)
	}
	return dial
}

// What a server asking for a client certificate was given (storeDialer).
const (
	askedNone = 1 + iota
	askedGiven
)

// bound sets a client's bounds (see [Redis]), in go-redis's Options or
// FailoverOptions alike: 3 s to dial, 5 s to read or write, the context's
// deadline, a pool of 8, retries after a network error, and no CLIENT
// SETINFO (older servers refuse it noisily). go-redis's five dials 100 ms
// apart are kept: a Redis restarted within them is reached, and one down
// longer costs 0.8 s only to the first exchanges, until the pool stops
// dialing (docs/DESIGN.md, "A replica cut off from Redis alone").
func bound(dial, read, write *time.Duration, ctxTimeout, noIdentity *bool, pool, maxRetries *int, retries int) {
	*dial, *read, *write = 3*time.Second, 5*time.Second, 5*time.Second
	*ctxTimeout, *noIdentity = true, true
	*pool, *maxRetries = 8, retries
}

// epochKey holds the store's epoch: a random number made when the store
// has none (a new store, or one that came back empty), part of every
// fence. It has no TTL.
const epochKey = "wt:epoch"

func recKey(id string) string   { return "wt:{" + id + "}:rec" }
func fenceKey(id string) string { return "wt:{" + id + "}:fence" }

// valKey is the key of field's value when it is kept out of line; the
// scripts make the same name from the record's key (valueFuncs).
func valKey(id, field string) string { return "wt:{" + id + "}:v:" + field }

// stageKey is a new key for a value on its way to its valKey: unique to
// the write, so that two writers of one field (one of them stale) never
// rename each other's bytes.
func stageKey(id string) string { return "wt:{" + id + "}:s:" + rand.Text() }

// outOfLine is the size from which a value is not passed to the write's
// script but set beside it, and renamed into place by the script once the
// fence is checked. Redis hashes every byte of a string that enters Lua
// (its patched luaS_newlstr), about 1.4 µs per KB here: a 32 KB value
// through the script took 175 to 205 µs a write against a loopback
// redis-server, set beside it 115 to 130 µs; at 4 KB the extra command
// costs more (85 to 90 µs against 100 to 110). A Go guest's checkpoint is
// 20 KB and more (docs/DESIGN.md, "Checkpoints write what changed").
const outOfLine = 16 << 10

// outOfLineMarker is what "f:NAME" holds while NAME's value is out of
// line: no sealed value nor record starts with a zero byte, so a replica
// that does not know this layout fails to open it and says the state was
// lost, rather than reading it as a state (docs/DEPLOY.md: a replica set
// is upgraded whole).
const outOfLineMarker = "\x00wasmtools: value out of line"

// stageTTL bounds how long a staged value outlives a write whose script
// never ran (a connection lost between the two).
const stageTTL = time.Minute

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
// what its caller reads after an error. Under a context that only its
// deadline ends (Detach), f runs on the caller's goroutine, which the
// deadline returns to as soon (deadline.go); a panic in the client then
// reaches the caller, where on the hand-off it ended the process.
func (r *Redis) call(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.closed.Load() {
		return ErrClosed
	}
	// A failure for want of an answer is marked ErrDropped when a
	// connection was refused or dropped since the server last answered
	// an exchange begun before it (this one's or another's: the
	// client's retries hide what its earlier attempts met, and another
	// exchange that met it may fail after this one), or it is a refusal
	// itself (the pool, past PoolSize failed dials, answers its last
	// dial error without dialing), or the server is loading its data
	// (restarted: its LOADING is counted as a drop on any attempt, and
	// is the error here when the last attempt met it).
	before := r.drops.n.Load()
	err := r.exchange(ctx, f)
	switch {
	case err == nil || !transport(err) && !redis.IsLoadingError(err):
		// Answered (an error of the server's is an answer).
		for a := r.answered.Load(); a < before && !r.answered.CompareAndSwap(a, before); a = r.answered.Load() {
		}
	case redis.IsLoadingError(err) || transport(err) && (connDrop(err) || r.drops.n.Load() != r.answered.Load()):
		return &droppedError{err}
	}
	return err
}

// transport reports whether err is the exchange failing for want of an
// answer (a deadline, a cancellation, the network), not the server's.
func transport(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.As(err, &ne) || connDrop(err) || errors.Is(err, redis.ErrPoolTimeout)
}

// exchange is call's exchange: f, its error mapped.
func (r *Redis) exchange(ctx context.Context, f func() error) error {
	var err error
	if DeadlineOnly(ctx) {
		err = f()
	} else {
		done := make(chan error, 1)
		r.run(func() { done <- f() })
		select {
		case err = <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	switch {
	case err == nil || errors.Is(err, redis.Nil):
		return nil
	case errors.Is(err, redis.ErrClosed) || r.closed.Load():
		return ErrClosed
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded) && pastDeadline(ctx):
		// The socket's deadline, which the client takes from ctx's,
		// fired before ctx's own timer did.
		return context.DeadlineExceeded
	}
	return fmt.Errorf("statestore: redis: %w", err)
}

// run runs job on a goroutine of its own: one that ran an earlier job and
// is waiting for another, else a new one. A new goroutine's stack grows
// through the client's calls every time (copied at each doubling, 15 µs
// of a Go guest's checkpoint against a loopback Redis); one kept for the
// next job keeps its stack until a collection finds it idle and shrinks
// it.
func (r *Redis) run(job func()) {
	select {
	case r.idle <- job:
	default:
		go r.serve(job)
	}
}

// serve runs job, then the jobs handed to it while it waits, until none
// comes for idleServe or the store is closed.
func (r *Redis) serve(job func()) {
	t := time.NewTimer(idleServe)
	defer t.Stop()
	for {
		job()
		t.Reset(idleServe)
		select {
		case job = <-r.idle:
		case <-t.C:
			return
		case <-r.quit:
			return
		}
	}
}

// idleServe is how long a call's goroutine waits for the next call.
const idleServe = 10 * time.Second

// pastDeadline reports whether ctx's deadline has come (within a
// millisecond).
func pastDeadline(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && time.Until(d) < time.Millisecond
}

// waited runs the commands queue adds in one pipeline (one connection,
// one round trip) and, when the store waits for replicas (wait_replicas),
// WAIT after them: WAIT counts the replicas that have what its own
// connection wrote, so it must follow the write on the write's
// connection. It returns the pipeline's error as Pipelined does (the
// caller reads its commands' own), and WAIT's verdict: nil, or
// [ErrNotReplicated], wrapping WAIT's own error when it got no answer.
// A write that gets ErrNotReplicated may have landed (the primary has
// it): it is the outcome of an exchange whose answer was lost, never a
// refusal. A verdict on a command that wrote nothing (a refusal, a
// fence that is not the holder's) covers the connection's earlier
// writes, which the refusal may rest on: it is kept too.
//
// A pipeline that met its connection closed by the store is sent again
// (resend), as go-redis would without WAIT, with a write of waitedKey
// before its WAIT: a resend that finds its first send landed writes
// nothing else, and WAIT counts the replicas that have its connection's
// offset, which a write moves to the primary's, past the first send's
// write (Redis 7.0 moves it after any command; the write is for a server
// that would move it only on a write: TestWaitResendCoversFirstSend).
func (r *Redis) waited(ctx context.Context, queue func(p redis.Pipeliner)) (pipeErr, waitErr error) {
	var wait *redis.Cmd
	for sent := 0; ; sent++ {
		_, pipeErr = r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			queue(p)
			if r.wait > 0 {
				if sent > 0 {
					p.Set(ctx, waitedKey, "1", time.Second)
				}
				// Pipeliner has no Wait; WAIT's timeout is in ms.
				wait = p.Do(ctx, "wait", r.wait, r.waitFor(ctx).Milliseconds())
			}
			return nil
		})
		if !r.resend(ctx, pipeErr, sent) {
			break
		}
	}
	if wait == nil {
		return pipeErr, nil
	}
	switch n, err := wait.Int64(); {
	case err != nil:
		return pipeErr, &notReplicatedError{err: err}
	case n < int64(r.wait):
		return pipeErr, &notReplicatedError{got: n, want: r.wait}
	}
	return pipeErr, nil
}

// waitedKey is what a resent pipeline writes before its WAIT (waited).
const waitedKey = "wt:waited"

// resends bounds how often an exchange is sent again after its connection
// was found closed by the store (resend): each pooled connection may be,
// go-redis's pool of PoolSize (8) and its pipelines' pool of 10.
const resends = 8 + redis.DefaultPipelinePoolSize

// resend reports whether an exchange that failed with err, sent sent+1
// times, is sent again: its connection was closed or reset by the store,
// which a restarted Redis and the old primary of a failover do to every
// client's (Sentinel's CLIENT KILL), and ctx has time left. go-redis's
// pool checks a pooled connection before it hands it out by a peek at
// its socket, which a TLS connection does not offer, and go-redis
// retries once (NewRedis; under WAIT not at all): over rediss:// each
// pooled connection failed an exchange, or each second one
// (TestWaitPooledConnectionsClosedAnswer). A resend is what go-redis's
// retry is: the scripts find their first send landed (their resent
// checks). A refused dial is not sent again: the store is down, and
// go-redis's dials waited already.
func (r *Redis) resend(ctx context.Context, err error, sent int) bool {
	return err != nil && sent < resends && ctx.Err() == nil && !r.closed.Load() &&
		(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
			errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}

// reading runs f, one command or script sent without WAIT (a read, or a
// write when the store does not wait for replicas), and again while
// resend says so.
func (r *Redis) reading(ctx context.Context, f func() error) error {
	for sent := 0; ; sent++ {
		err := f()
		if !r.resend(ctx, err, sent) {
			return err
		}
	}
}

// waitFor is WAIT's bound under ctx: waitTimeout, but at most 2/3 of
// what ctx's deadline leaves, so that WAIT answers (a verdict) before the
// exchange's deadline ends it (no answer): Redis ends a WAIT on its event
// loop's tick, 50 to 100 ms late at its default hz. At least 1 ms: WAIT 0
// waits for ever.
func (r *Redis) waitFor(ctx context.Context) time.Duration {
	d := r.waitTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)*2/3)
	}
	return max(d, time.Millisecond)
}

// notReplicatedError is a write's [ErrNotReplicated]: WAIT counted got of
// want replicas, or did not answer (err).
type notReplicatedError struct {
	got  int64
	want int
	err  error
}

func (e *notReplicatedError) Error() string {
	if e.err != nil {
		return "the write's WAIT for replicas got no answer: " + e.err.Error()
	}
	return fmt.Sprintf("the write reached %d of the %d replicas it waits for (wait_replicas)", e.got, e.want)
}

// Unwrap is ErrNotReplicated, and WAIT's own error when it got no answer:
// an exchange that met the store's silence there is silent, as any other
// (internal/durable's hand-over), while one that WAIT answered short is
// not: the store answered.
func (e *notReplicatedError) Unwrap() []error {
	if e.err != nil {
		return []error{ErrNotReplicated, e.err}
	}
	return []error{ErrNotReplicated}
}

// script runs s as s.Run would (by its SHA-1, then its text if Redis does
// not know it), and when the store waits for replicas, WAIT after it
// (waited): the command's error is then WAIT's verdict when the script
// itself succeeded.
func (r *Redis) script(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	if r.wait == 0 {
		for sent := 0; ; sent++ {
			cmd := s.Run(ctx, r.c, keys, args...)
			if !r.resend(ctx, cmd.Err(), sent) {
				return cmd
			}
		}
	}
	var werr error
	cmd := r.bySHA(s, func(bySHA bool) *redis.Cmd {
		var cmd *redis.Cmd
		_, werr = r.waited(ctx, func(p redis.Pipeliner) {
			if bySHA {
				cmd = s.EvalSha(ctx, p, keys, args...)
			} else {
				cmd = s.Eval(ctx, p, keys, args...)
			}
		})
		return cmd
	})
	if cmd.Err() == nil && werr != nil {
		cmd.SetErr(werr)
	}
	return cmd
}

// bySHA runs a script through run, by its SHA-1 when it ran on this store
// before, by its text otherwise or when Redis does not know it
// (NOSCRIPT: a restarted, flushed or new primary), and notes that it ran.
// A pipeline sent by SHA-1 and refused NOSCRIPT costs its WAIT still,
// which waits for the connection's earlier writes: sent twice on a first
// use, a write waited twice, past the exchange's deadline
// (TestWaitNotReplicated).
func (r *Redis) bySHA(s *redis.Script, run func(bySHA bool) *redis.Cmd) *redis.Cmd {
	_, known := r.loaded.Load(s)
	cmd := run(known)
	if known && redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = run(false)
	}
	if cmd.Err() == nil {
		r.loaded.Store(s, true)
	} else if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		r.loaded.Delete(s)
	}
	return cmd
}

// command runs the command cmd adds (a heartbeat's SET, a DEL) and, when
// the store waits for replicas, WAIT after it (waited).
func (r *Redis) command(ctx context.Context, cmd func(p redis.Cmdable) redis.Cmder) error {
	if r.wait == 0 {
		return r.reading(ctx, func() error { return cmd(r.c).Err() })
	}
	var c redis.Cmder
	_, werr := r.waited(ctx, func(p redis.Pipeliner) { c = cmd(p) })
	if err := c.Err(); err != nil {
		return err
	}
	return werr
}

func (r *Redis) Heartbeat(ctx context.Context, owner Owner, ttl time.Duration) error {
	return r.call(ctx, func() error {
		return r.command(ctx, func(c redis.Cmdable) redis.Cmder {
			return c.Set(ctx, ownerKey(owner), "1", time.Duration(ms(ttl))*time.Millisecond)
		})
	})
}

func (r *Redis) Leave(ctx context.Context, owner Owner) error {
	return r.call(ctx, func() error {
		return r.command(ctx, func(c redis.Cmdable) redis.Cmder { return c.Del(ctx, ownerKey(owner)) })
	})
}

// valueFuncs are the Lua functions of the scripts that meet a record's
// out-of-line values (its "o:NAME" fields; a value key's name is the
// record's with "v:NAME" for "rec", as valKey makes it):
//
//   - extendValues gives them a TTL of ttl ms, after the record's: every
//     script that renews the record's TTL calls it, so that a value never
//     expires before its record. extendKeys does it for keys listed
//     already.
//   - dropValues deletes them.
//   - checkValues drops the record and its values when one of them is
//     gone (evicted apart from it), as if Redis had evicted the record:
//     every script that claims, renews or writes a record calls it
//     first, so that the holder's next write fails with ErrRecordLost
//     and the holder writes the session back, or the next claim starts
//     afresh, rather than writing on beside a state that reads as
//     broken (getScript) for as long as the record lives. The fence
//     counter stays, so a stale owner stays fenced. It returns the value
//     keys it found, none when it dropped the record.
//
// A call from Lua into Redis costs a few µs on a busy machine (command
// lookup, arguments and reply converted each way), a Go guest's
// checkpoint made 16 of them, and a write's script is most of what Redis
// does for a checkpoint: so one EXISTS checks the values (64 keys at a
// time, as Lua's stack bounds unpack), and a write extends the keys it
// checked rather than listing them again.
const valueFuncs = `
local function leaseKey(rec)
  return string.sub(rec, 1, -4) .. 'lease'
end
local function stampLease(rec, owner, ms)
  if owner and owner ~= '' and tonumber(ms) > 0 then redis.call('SET', leaseKey(rec), owner, 'PX', ms) end
end
local function valueKeys(rec)
  local prefix, out = string.sub(rec, 1, -4) .. 'v:', {}
  for _, k in ipairs(redis.call('HKEYS', rec)) do
    if string.sub(k, 1, 2) == 'o:' then table.insert(out, prefix .. string.sub(k, 3)) end
  end
  return out
end
local function extendKeys(keys, ttl)
  for _, k in ipairs(keys) do redis.call('PEXPIRE', k, ttl) end
end
local function extendValues(rec, ttl)
  extendKeys(valueKeys(rec), ttl)
end
local function dropValues(rec)
  for _, k in ipairs(valueKeys(rec)) do redis.call('DEL', k) end
end
local function checkValues(rec)
  local keys = valueKeys(rec)
  for i = 1, #keys, 64 do
    local j = math.min(i + 63, #keys)
    if redis.call('EXISTS', unpack(keys, i, j)) < j - i + 1 then
      for _, v in ipairs(keys) do redis.call('DEL', v) end
      redis.call('DEL', rec)
      return {}
    end
  end
  return keys
end
`

// claimScript: KEYS rec, fence counter, epoch; ARGV owner key, replica,
// boot, ttl ms, fence ttl ms, steal, a new epoch (used when the store has
// none), a random first fence (used when neither the counter nor the
// record has one), the lease ms, and the claim's own random ID. Returns
// {0, epoch, n, taken} (held already, under this epoch; taken: the
// number of the claim that made the holder, "m:taken"), {1, replica,
// boot} (held by a live owner), or {2, epoch, n, prev replica, prev boot,
// prev alive}. Like Memory, every claim renews the record's TTL.
//
// A claim that made its owner the holder notes its ID and what it
// answered ("m:cid", "m:pr", "m:pb", "m:pa"): the same claim sent again
// (resend, go-redis's retry: its first answer lost) answers that again,
// not "held already", which would tell the claimant that no one claimed
// the session since its own last claim (internal/durable's Ended then
// deleted the record of calls the previous holder acknowledged).
//
// The holder and its fence (epoch and number) live together in the
// record's hash, so that a write compares both in one place; the counter
// key is only a floor for the next number, and the epoch key says which
// store generation the fence belongs to: a store that lost its keys has a
// new epoch, and every fence of the old one is refused.
var claimScript = redis.NewScript(valueFuncs + quotaFuncs + `
local rec, fk, ek = KEYS[1], KEYS[2], KEYS[3]
local lease = tonumber(ARGV[9])
if lease > 0 then
  local lo = redis.call('GET', leaseKey(rec))
  if lo and lo ~= ARGV[1] then
    local left = math.min(redis.call('PTTL', leaseKey(rec)), lease)
    if left > 0 then
      local w = redis.call('HMGET', rec, 'm:replica', 'm:boot')
      return {3, w[1] or '', w[2] or '', left}
    end
  end
end
checkValues(rec)
local epoch = redis.call('GET', ek)
if not epoch then redis.call('SET', ek, ARGV[7]); epoch = ARGV[7] end
local h = redis.call('HMGET', rec, 'm:owner', 'm:replica', 'm:boot', 'm:epoch', 'm:n', 'm:taken', 'm:t', 'm:cid', 'm:pr', 'm:pb', 'm:pa')
if redis.call('EXISTS', rec) == 1 then
  redis.call('PEXPIRE', rec, ARGV[4])
  extendValues(rec, ARGV[4])
  extendQuota(h[7], ARGV[4])
end
if h[1] == ARGV[1] and h[4] == epoch and h[5] then
  redis.call('HDEL', rec, 'm:bumped')
  stampLease(rec, ARGV[1], ARGV[9])
  redis.call('PEXPIRE', fk, ARGV[5])
  if h[8] == ARGV[10] and h[5] == h[6] then
    return {2, epoch, h[5], h[9] or '', h[10] or '', tonumber(h[11] or '0')}
  end
  return {0, epoch, h[5], h[6] or '0'}
end
local pr, pb, alive = '', '', 0
if h[1] and h[1] ~= '' then
  alive = redis.call('EXISTS', h[1])
  if alive == 1 and ARGV[6] ~= '1' then return {1, h[2], h[3]} end
  pr, pb = h[2], h[3]
end
local c, r = tonumber(redis.call('GET', fk) or '0'), tonumber(h[5] or '0')
local n = math.max(c, r) + 1
if c == 0 and r == 0 then n = tonumber(ARGV[8]) end
redis.call('SET', fk, n, 'PX', ARGV[5])
local vh = redis.call('HMGET', rec, 'm:v', 'm:head')
redis.call('HSET', rec, 'm:owner', ARGV[1], 'm:replica', ARGV[2], 'm:boot', ARGV[3], 'm:epoch', epoch, 'm:n', n, 'm:taken', n, 'm:cv', vh[1] or '0', 'm:ch', vh[2] or '',
  'm:cid', ARGV[10], 'm:pr', pr or '', 'm:pb', pb or '', 'm:pa', alive)
stampLease(rec, ARGV[1], ARGV[9])
redis.call('HDEL', rec, 'm:bumped')
redis.call('PEXPIRE', rec, ARGV[4])
extendValues(rec, ARGV[4])
return {2, epoch, tostring(n), pr, pb, alive}
`)

// fenceArgs splits a fence into the strings the scripts compare.
func fenceArgs(fence uint64) (epoch, n string) {
	return strconv.FormatUint(fence>>32, 10), strconv.FormatUint(fence&0xffffffff, 10)
}

// joinFence is fenceArgs' inverse.
func joinFence(epoch, n string) (uint64, bool) {
	e, err1 := strconv.ParseUint(epoch, 10, 32)
	k, err2 := strconv.ParseUint(n, 10, 32)
	return e<<32 | k, err1 == nil && err2 == nil && e != 0
}

func (r *Redis) Claim(ctx context.Context, id string, owner Owner, ttl time.Duration, steal bool) (Claim, error) {
	var res []any
	err := r.call(ctx, func() (err error) {
		res, err = r.script(ctx, claimScript, []string{recKey(id), fenceKey(id), epochKey},
			ownerKey(owner), owner.Replica, owner.Boot, ms(ttl), fenceMS(ttl), steal,
			newEpoch(), firstFence(), r.lease.Milliseconds(), rand.Text()).Slice()
		return err
	})
	if err != nil {
		return Claim{}, err
	}
	str := func(i int) string {
		switch v := res[i].(type) {
		case string:
			return v
		case int64:
			return strconv.FormatInt(v, 10)
		}
		return ""
	}
	num := func(i int) uint64 { n, _ := res[i].(int64); return uint64(n) }
	switch {
	case len(res) == 4 && num(0) == 0:
		if f, ok := joinFence(str(1), str(2)); ok {
			var taken uint64 // 0 when the record has none
			if str(3) != "0" {
				taken, _ = joinFence(str(1), str(3))
			}
			return Claim{Fence: f, Taken: taken, Held: true}, nil
		}
	case len(res) == 3 && num(0) == 1:
		return Claim{}, &HeldError{Holder: Owner{Replica: str(1), Boot: str(2)}}
	case len(res) == 4 && num(0) == 3:
		return Claim{}, &LeasedError{Holder: Owner{Replica: str(1), Boot: str(2)}, Wait: time.Duration(num(3)) * time.Millisecond}
	case len(res) == 6 && num(0) == 2:
		if f, ok := joinFence(str(1), str(2)); ok {
			return Claim{Fence: f, Taken: f, Previous: Owner{Replica: str(3), Boot: str(4)}, PreviousAlive: num(5) == 1}, nil
		}
	}
	return Claim{}, fmt.Errorf("statestore: redis: claim: unexpected reply %v", res)
}

// checkFence is the test every write makes, at the top of its script:
// KEYS[1] rec, KEYS[3] epoch; ARGV[1] epoch, ARGV[2] number. It returns
// from the script with 3 when the store's epoch is not the fence's (the
// store lost its data), 4 when the record is gone (expired, evicted,
// flushed), 0 when another owner (or none) holds the session. It reads
// the record's version and head too, as h[4] and h[5], for
// checkVersion, and its tenant and bytes, h[8] and h[9], for quotaCheck:
// calls fewer. It is checkRecord, then checkOwner; a
// write's script may put a test between the two (writeScript's resent).
const checkFence = checkRecord + checkOwner

const checkRecord = `
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return 3 end
local h = redis.call('HMGET', KEYS[1], 'm:owner', 'm:epoch', 'm:n', 'm:v', 'm:head', 'm:cv', 'm:ch', 'm:t', 'm:bytes')
if not h[2] then return 4 end
`

const checkOwner = `
if not h[1] or h[1] == '' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] then return 0 end
`

// A write's script: KEYS rec, fence counter, epoch, the field's value
// key, and for a value out of line its staged key; ARGV epoch, n, field,
// value (outOfLineMarker when out of line), ttl ms, fence ttl ms, and a
// versioned write's arguments (putVersionedScripts), the lease, and
// quotaCheck's (ARGV[11..16]). It returns 1, or checkFence's refusal, or
// a versioned write's (5), or a budget's (7, 8); 6 when the staged
// value is not there: evicted, or already renamed by this same write sent
// before (a plain Put that the client resent on another connection after
// its first send landed; a versioned write sent again finds its version
// first), so the write may have landed. A refused write out of line
// deletes its staged value.
//
// writeScript makes the script from its parts: resent, a test between
// checkRecord and checkOwner, returns 1 for this same write sent again
// after it landed (a versioned write's, checkResent), or nothing; check,
// after checkOwner, returns a code to refuse the write with, or nothing;
// then quotaCheck refuses a write past a budget of its [Quota] (so a
// refused or resent write counts nothing), and quotaSettle counts it once
// written; write stores the value in line (writeInline) or out of line
// (writeOutOfLine). Both end with the record's TTL.
func writeScript(resent, check, write string) *redis.Script {
	return redis.NewScript(valueFuncs + quotaFuncs + `
local values = checkValues(KEYS[1])
local q
local code = (function()
` + checkRecord + resent + checkOwner + check + quotaCheck + `
end)()
if code then
  if KEYS[5] then redis.call('DEL', KEYS[5]) end
  return code
end
` + write + quotaSettle + `
stampLease(KEYS[1], redis.call('HGET', KEYS[1], 'm:owner'), ARGV[10])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
extendKeys(values, ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return 1
`)
}

// writeInline writes ARGV[4] into the field, and drops the value the
// field had out of line, if it had one. extra is more of the record's
// fields to set with it, and quotaFields the record's own count.
func writeInline(extra string) string {
	return `
if redis.call('HDEL', KEYS[1], 'o:' .. string.sub(ARGV[3], 3)) == 1 then redis.call('DEL', KEYS[4]) end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4]` + extra + `, unpack(quotaFields(q)))
`
}

// writeOutOfLine renames the staged value to the field's value key (the
// staged key's TTL goes with it, and the script sets the record's, as it
// does for the value keys checkValues found, which the field's joins) and
// marks the field out of line. A staged value not there (RENAME's "no such
// key") returns 6.
func writeOutOfLine(extra string) string {
	return `
local renamed = redis.pcall('RENAME', KEYS[5], KEYS[4])
if renamed.err then
  if string.find(renamed.err, 'no such key', 1, true) then return 6 end
  return renamed
end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4], 'o:' .. string.sub(ARGV[3], 3), '1'` + extra + `, unpack(quotaFields(q)))
local listed = false
for _, k in ipairs(values) do listed = listed or k == KEYS[4] end
if not listed then table.insert(values, KEYS[4]) end
`
}

// putScripts are Put's: the field's value and the record's TTL.
var putScripts = scriptPair{
	inline:    writeScript("", "", writeInline("")),
	outOfLine: writeScript("", "", writeOutOfLine("")),
}

// scriptPair is a write's script for a value in line and out of line.
type scriptPair struct{ inline, outOfLine *redis.Script }

// renewScript: KEYS rec, fence counter, epoch; ARGV epoch, n, ttl ms,
// fence ttl ms, bump (a new number for the same holder). Returns {1, n},
// or checkFence's refusal. A bump from the number the holder's last bump
// replaced ("m:bumped", cleared by a claim) is that bump sent again: it
// returns the number it made.
var renewScript = redis.NewScript(valueFuncs + quotaFuncs + `
checkValues(KEYS[1])
if ARGV[5] == '1' and redis.call('GET', KEYS[3]) == ARGV[1] then
  local b = redis.call('HMGET', KEYS[1], 'm:owner', 'm:epoch', 'm:bumped', 'm:n')
  if b[1] and b[1] ~= '' and b[2] == ARGV[1] and b[3] == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    extendValues(KEYS[1], ARGV[3])
    redis.call('PEXPIRE', KEYS[2], ARGV[4])
    return {1, b[4]}
  end
end
` + checkFence + `
local n = ARGV[2]
if ARGV[5] == '1' then
  n = tostring(math.max(tonumber(redis.call('GET', KEYS[2]) or '0'), tonumber(ARGV[2])) + 1)
  redis.call('HSET', KEYS[1], 'm:n', n, 'm:bumped', ARGV[2])
  redis.call('SET', KEYS[2], n)
end
stampLease(KEYS[1], h[1], ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
extendValues(KEYS[1], ARGV[3])
extendQuota(h[8], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {1, n}
`)

// putVersionedScripts: a write's arguments (writeScript) and ARGV[7] the
// version replaced, ARGV[8] the next version, ARGV[9] the head. They
// return 5 when the record's version is not the one replaced (checkVersion
// reads it from checkFence's h). The same write resent (the client's
// retry after a lost reply) finds its own version and head and returns 1
// without writing (checkResent), before the owner is checked: another
// replica may have claimed the session between the two sends, and the
// write is in the record it read, so a refusal as fenced would have told
// the writer that nothing of its call landed, and it ran the call again
// (TestResentWriteAfterClaimLanded; a review, stop 57). Nor is the resend
// refused once the new holder wrote: the claim that changed the holder
// kept the record's version and head then ("m:cv", "m:ch"), the last
// write of the holder before, which its resend finds too (stop 59:
// refused as fenced, a keyless call was run again;
// TestResentWriteAfterOtherWriteLanded). A head is sealed with a nonce of
// its own, so no other write has the same one.
var putVersionedScripts = scriptPair{
	inline:    writeScript(checkResent, checkVersion, writeInline(versionFields)),
	outOfLine: writeScript(checkResent, checkVersion, writeOutOfLine(versionFields)),
}

const checkResent = `
if (h[4] == ARGV[8] and h[5] == ARGV[9]) or (h[6] == ARGV[8] and h[7] == ARGV[9]) then return 1 end
`

const checkVersion = `
if (h[4] or '0') ~= ARGV[7] then return 5 end
`

const versionFields = `, 'm:v', ARGV[8], 'm:head', ARGV[9]`

// headScript: KEYS rec. Returns {version, head, field keys...}, the
// version and head false when absent.
var headScript = redis.NewScript(`
local out = redis.call('HMGET', KEYS[1], 'm:v', 'm:head')
for _, k in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(k, 1, 2) == 'f:' then table.insert(out, k) end
end
return out
`)

// refusal maps checkFence's codes to errors.
func refusal(code int64) error {
	switch code {
	case 1:
		return nil
	case 5:
		return errVersion
	case 3:
		return ErrStoreLost
	case 4:
		return ErrRecordLost
	}
	return ErrFenced
}

func (r *Redis) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	return r.write(ctx, putScripts, id, field, value, fence, ttl)
}

// write runs a script of Put's arguments, and more (putVersionedScripts').
// A value of outOfLine bytes or more is set beside the script, in the same
// pipeline (one round trip), under a key of its own that the script
// renames into place.
func (r *Redis) write(ctx context.Context, scripts scriptPair, id, field string, value []byte, fence uint64, ttl time.Duration, more ...any) error {
	if len(value) > MaxValue {
		return ErrTooLarge
	}
	e, n := fenceArgs(fence)
	keys := []string{recKey(id), fenceKey(id), epochKey, valKey(id, field)}
	args := append([]any{e, n, "f:" + field, value, ms(ttl), fenceMS(ttl)}, more...)
	for len(args) < 9 {
		args = append(args, "") // a plain Put's scripts read no ARGV[7..9]
	}
	args = append(args, r.lease.Milliseconds()) // ARGV[10]: the holder's lease
	q := quotaOf(ctx)                           // ARGV[11..16]: quotaCheck's
	args = append(args, q.Tenant, q.PerTenant, q.Total, len(value), replacingOf(ctx), q.Assumed)
	var code int64
	err := r.call(ctx, func() (err error) {
		if len(value) < outOfLine {
			code, err = r.script(ctx, scripts.inline, keys, args...).Int64()
			return err
		}
		args[3] = outOfLineMarker
		code, err = r.staged(ctx, scripts.outOfLine, append(keys, stageKey(id)), value, args)
		return err
	})
	if err != nil {
		return err
	}
	switch code {
	case 6:
		return fmt.Errorf("statestore: redis: the value set beside the write of %s/%s was not there (evicted?)", IDLabel(id), field)
	case 7:
		return &BudgetError{Tenant: true, Budget: q.PerTenant}
	case 8:
		return &BudgetError{Budget: q.Total}
	}
	return refusal(code)
}

// staged sets value under the last of keys and runs script in one
// pipeline, as script.Run would: by its SHA-1, and again by its text if
// Redis does not know it (a restarted or flushed server; bySHA), then
// WAIT when the store waits for replicas (waited). The script's
// reply decides: the set's error (out of memory) is returned only when
// the script found nothing staged (6) or did not reply.
func (r *Redis) staged(ctx context.Context, script *redis.Script, keys []string, value []byte, args []any) (int64, error) {
	var set *redis.StatusCmd
	var werr error
	cmd := r.bySHA(script, func(bySHA bool) *redis.Cmd {
		var cmd *redis.Cmd
		var err error
		err, werr = r.waited(ctx, func(p redis.Pipeliner) {
			set = p.Set(ctx, keys[len(keys)-1], value, stageTTL)
			if bySHA {
				cmd = script.EvalSha(ctx, p, keys, args...)
			} else {
				cmd = script.Eval(ctx, p, keys, args...)
			}
		})
		if cmd == nil || set == nil { // not sent
			cmd = redis.NewCmd(ctx)
			cmd.SetErr(err)
		}
		return cmd
	})
	code, cerr := cmd.Int64()
	switch {
	case cerr != nil:
		return 0, cerr
	case code == 6 && set.Err() != nil:
		return 0, set.Err()
	case werr != nil:
		return 0, werr
	}
	return code, nil
}

func (r *Redis) putVersioned(ctx context.Context, id, field string, value, head []byte, fence, prev uint64, ttl time.Duration) error {
	return r.write(ctx, putVersionedScripts, id, field, value, fence, ttl,
		strconv.FormatUint(prev, 10), strconv.FormatUint(prev+1, 10), head)
}

// parseVersion reads the record's version "m:v", absent for 0.
func parseVersion(v any) (uint64, error) {
	switch v := v.(type) {
	case nil:
		return 0, nil
	case string:
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("statestore: redis: record version %q: %v", v, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("statestore: redis: record version %v", v)
}

func (r *Redis) readHead(ctx context.Context, id string) (uint64, []byte, []string, error) {
	var res []any
	err := r.call(ctx, func() (err error) {
		return r.reading(ctx, func() (err error) {
			res, err = headScript.Run(ctx, r.c, []string{recKey(id)}).Slice()
			return err
		})
	})
	if err != nil {
		return 0, nil, nil, err
	}
	if len(res) < 2 {
		return 0, nil, nil, fmt.Errorf("statestore: redis: head: unexpected reply %v", res)
	}
	version, err := parseVersion(res[0])
	if err != nil {
		return 0, nil, nil, err
	}
	var head []byte
	if h, ok := res[1].(string); ok {
		head = []byte(h)
	}
	var fields []string
	for _, k := range res[2:] {
		if s, ok := k.(string); ok {
			fields = append(fields, strings.TrimPrefix(s, "f:"))
		}
	}
	return version, head, fields, nil
}

// getScript: KEYS rec. Returns the record's fields and values as HGETALL
// does, then "v:NAME" and the value (false when it is gone) of each field
// kept out of line, read in the same atomic step.
var getScript = redis.NewScript(`
local all = redis.call('HGETALL', KEYS[1])
local prefix = string.sub(KEYS[1], 1, -4) .. 'v:'
for i = 1, #all, 2 do
  local k = all[i]
  if string.sub(k, 1, 2) == 'o:' then
    table.insert(all, 'v:' .. string.sub(k, 3))
    table.insert(all, redis.call('GET', prefix .. string.sub(k, 3)))
  end
end
return all
`)

func (r *Redis) getVersioned(ctx context.Context, id string) (map[string][]byte, uint64, []byte, error) {
	var res []any
	err := r.call(ctx, func() (err error) {
		return r.reading(ctx, func() (err error) {
			res, err = getScript.Run(ctx, r.c, []string{recKey(id)}).Slice()
			return err
		})
	})
	if err != nil {
		return nil, 0, nil, err
	}
	all := make(map[string]any, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		if k, ok := res[i].(string); ok {
			all[k] = res[i+1]
		}
	}
	out := map[string][]byte{}
	for k, v := range all {
		name, ok := strings.CutPrefix(k, "f:")
		if !ok {
			continue
		}
		// Out of line: the marker, and "o:NAME". (An in-line value
		// beside "o:NAME" would be an older replica's write, which
		// does not know the layout: its value is the current one.)
		if _, far := all["o:"+name]; far && v == outOfLineMarker {
			if v, ok = all["v:"+name].(string); !ok {
				// Evicted, or expired apart from its record: the
				// state is not there, as a value that does not open.
				return nil, 0, nil, &SealError{ID: id, Field: name, Reason: "its value, kept out of line, is gone from Redis"}
			}
		}
		s, _ := v.(string)
		out[name] = []byte(s)
	}
	if len(out) == 0 {
		return nil, 0, nil, ErrNotFound
	}
	version, err := parseVersion(all["m:v"])
	if err != nil {
		return nil, 0, nil, err
	}
	var head []byte
	if h, ok := all["m:head"].(string); ok {
		head = []byte(h)
	}
	return out, version, head, nil
}

func (r *Redis) Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (uint64, error) {
	e, n := fenceArgs(fence)
	var res any
	err := r.call(ctx, func() (err error) {
		res, err = r.script(ctx, renewScript, []string{recKey(id), fenceKey(id), epochKey},
			e, n, ms(ttl), fenceMS(ttl), bump, r.lease.Milliseconds()).Result()
		return err
	})
	if err != nil {
		return 0, err
	}
	switch v := res.(type) {
	case int64:
		return 0, refusal(v)
	case []any:
		if len(v) == 2 {
			s, _ := v[1].(string)
			if f, ok := joinFence(e, s); ok {
				return f, nil
			}
		}
	}
	return 0, fmt.Errorf("statestore: redis: renew: unexpected reply %v", res)
}

// lostKey records that the store lost an earlier epoch's data (see
// epochScript): a hash of "epoch" (the store's epoch when the loss was
// recorded), "lost" (the epoch lost), "at" (when, by the recorder's
// clock: Unix ms, for an operator) and "window" (ms), which it expires
// after. Its age is read by the store's clock, as the window less what is
// left of its TTL: the recorder's "at" against a reader's clock would
// carry their skew.
const lostKey = "wt:lost"

// epochScript: KEYS epoch, lost; ARGV a new epoch (used when the store
// has none), the epoch the caller saw before (0 for none), window ms, the
// caller's clock (Unix ms: not the script's TIME, which older servers
// refuse before a write).
// Returns {epoch, lost, ago}: lost is 1 while a loss is recorded for the
// store's epoch, ago how long ago it was recorded (ms, by the store's
// clock: PTTL, read after the writes, which older servers allow; a
// record of a replica that wrote no window is aged by the caller's). The
// two keys are in different slots, as a claim's
// heartbeat key is: one Redis server, not Cluster.
var epochScript = redis.NewScript(`
local e = redis.call('GET', KEYS[1])
if not e then redis.call('SET', KEYS[1], ARGV[1]); e = ARGV[1] end
if ARGV[2] ~= '0' and ARGV[2] ~= e and redis.call('HGET', KEYS[2], 'epoch') ~= e then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'epoch', e, 'lost', ARGV[2], 'at', ARGV[4], 'window', ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if redis.call('HGET', KEYS[2], 'epoch') == e then
  local w = tonumber(redis.call('HGET', KEYS[2], 'window') or ARGV[3]) or 0
  local left = redis.call('PTTL', KEYS[2])
  if left < 0 then left = 0 end
  return {e, 1, math.max(w - left, 0)}
end
return {e, 0, 0}
`)

func (r *Redis) Epoch(ctx context.Context, seen uint32, window time.Duration) (uint32, Loss, error) {
	var res []any
	err := r.call(ctx, func() (err error) {
		res, err = r.script(ctx, epochScript, []string{epochKey, lostKey}, newEpoch(), seen, max(window.Milliseconds(), 1), time.Now().UnixMilli()).Slice()
		return err
	})
	if err != nil {
		return 0, Loss{}, err
	}
	if len(res) == 3 {
		s, _ := res[0].(string)
		lost, _ := res[1].(int64)
		ago, _ := res[2].(int64)
		if e, err := strconv.ParseUint(s, 10, 32); err == nil && e != 0 {
			if lost != 1 {
				return uint32(e), Loss{}, nil
			}
			return uint32(e), Loss{Recorded: true, Ago: time.Duration(ago) * time.Millisecond}, nil
		}
	}
	return 0, Loss{}, fmt.Errorf("statestore: redis: epoch: unexpected reply %v", res)
}

func (r *Redis) Get(ctx context.Context, id string) (map[string][]byte, error) {
	fields, _, _, err := r.getVersioned(ctx, id)
	return fields, err
}

// releaseScript: KEYS rec, fence; ARGV fence. The holder is blanked, not
// removed, so the record (its fields, its TTL) stays as it was.
var releaseScript = redis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'm:owner', 'm:epoch', 'm:n')
if h[1] and h[1] ~= '' and h[2] == ARGV[1] and h[3] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'm:owner', '', 'm:replica', '', 'm:boot', '')
  redis.call('DEL', string.sub(KEYS[1], 1, -4) .. 'lease')
end
return 1
`)

func (r *Redis) Release(ctx context.Context, id string, fence uint64) error {
	e, n := fenceArgs(fence)
	return r.call(ctx, func() error {
		return r.script(ctx, releaseScript, []string{recKey(id), fenceKey(id)}, e, n).Err()
	})
}

// deleteScript: KEYS rec, fence; ARGV fence, fence ttl ms. Returns 1, or
// 0 when fenced. The record is emptied but kept until it would have
// expired, as Memory does; the fence stays.
var deleteScript = redis.NewScript(valueFuncs + quotaFuncs + `
if redis.call('EXISTS', KEYS[1]) == 0 then return 1 end
local h = redis.call('HMGET', KEYS[1], 'm:epoch', 'm:n', 'm:t')
if h[1] ~= ARGV[1] or h[2] ~= ARGV[2] then return 0 end
if h[3] and h[3] ~= '' then
  local id = recID(KEYS[1])
  local counted = tonumber(redis.call('HGET', quotaKey(h[3]), id) or '0')
  if redis.call('HDEL', quotaKey(h[3]), id) == 1 then adjust(h[3], -counted) end
end
local pttl = redis.call('PTTL', KEYS[1])
dropValues(KEYS[1])
redis.call('DEL', KEYS[1], leaseKey(KEYS[1]))
redis.call('HSET', KEYS[1], 'm:owner', '', 'm:replica', '', 'm:boot', '', 'm:epoch', h[1], 'm:n', h[2])
if pttl > 0 then redis.call('PEXPIRE', KEYS[1], pttl) end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
`)

func (r *Redis) Delete(ctx context.Context, id string, fence uint64) error {
	var ok int64
	err := r.call(ctx, func() (err error) {
		e, n := fenceArgs(fence)
		ok, err = r.script(ctx, deleteScript, []string{recKey(id), fenceKey(id)}, e, n, fenceMS(0)).Int64()
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
	close(r.quit)
	return r.c.Close()
}
