package statestore

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrDropped marks the failure of an exchange during which (or since the
// store last answered one begun before) the store refused a connection
// of this process's, or its end closed or reset one, or answered
// LOADING: its process went down, or is restarting. A store
// restarted may come back empty (Redis without persistence) or older (a
// snapshot), which a store that only went silent (frozen, a link
// blackholed) does not: a replica then keeps the sessions it holds rather
// than hand them over (internal/durable's ServeElsewhere). The error is
// the client's own besides, often just the exchange's deadline: the Redis
// client retries after a dropped connection and dials five times before
// it fails, so that what it returns is its last attempt's (a dial to a
// host gone silent, the deadline), and checks a pooled connection before
// it uses it, closing one the store closed without a word.
var ErrDropped = errors.New("statestore: the store refused or dropped a connection during the exchange")

// droppedError is an exchange's error marked [ErrDropped].
type droppedError struct{ err error }

func (e *droppedError) Error() string {
	return e.err.Error() + " (the store refused or dropped a connection meanwhile)"
}

func (e *droppedError) Unwrap() []error { return []error{e.err, ErrDropped} }

// connDrop reports whether err is the store's end refusing a dial, or
// closing or resetting a connection. A Unix socket's file missing
// (ENOENT) is a refusal too: Redis removes its socket when it shuts down.
func connDrop(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// idleDrop is how long a connection may have gone unanswered (idle in
// the pool) for the store's closing it still to count: a server's idle
// timeout (Redis's `timeout`, a balancer's or a NAT's) closes one idle
// longer as well as a store going down does, and a store going down
// closes the connections in use too, which are counted (the heartbeat's
// is used every 2 s). Counted, an idle one closed was read as the store
// going down by the first exchange to fail after it, a blackholed link's,
// and the cut-off replica kept its sessions for the whole partition.
const idleDrop = 30 * time.Second

// dropsBase is what a connection's times count from (monotonic).
var dropsBase = time.Now()

// drops counts the connections to the store it refused or dropped, and
// its replies of LOADING: a [Redis]'s dialer wraps each connection in a
// watchedConn that counts them.
type drops struct {
	n atomic.Uint64
	// ahead moves the clock a connection's idle time is told by
	// forward: a test's wait.
	ahead atomic.Int64
}

// dialer wraps dial: a dial refused, and each connection's read or write
// the store's end failed, or close of one it closed first, is counted.
func (d *drops) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			d.note(err)
			return nil, err
		}
		w := &watchedConn{Conn: c, d: d}
		w.answered.Store(d.now())
		if sc, ok := c.(syscall.Conn); ok {
			// The client checks a pooled connection before it uses it
			// by peeking at its socket (a syscall.Conn's): keep that.
			return &watchedSysConn{watchedConn: w, sc: sc}, nil
		}
		return w, nil
	}
}

// now is the time on the connections' clock.
func (d *drops) now() int64 { return int64(time.Since(dropsBase)) + d.ahead.Load() }

func (d *drops) note(err error) {
	if err != nil && connDrop(err) {
		d.n.Add(1)
	}
}

// watchedConn is a connection to the store whose drop is counted, once,
// and each reply of LOADING.
type watchedConn struct {
	net.Conn
	d        *drops
	closed   atomic.Bool  // by this process
	dropped  atomic.Bool  // counted
	answered atomic.Int64 // when it was dialed or last read from (drops.now)

	mu sync.Mutex
	// head is the start of the reply to what was last written, while
	// it may still be LOADING's: len(loadingReply) bytes at most.
	head    [len(loadingReply)]byte
	headLen int
	inReply bool // head is being read
}

// loadingReply is how Redis begins its reply to a command while it loads
// its data (restarted). go-redis retries a command so answered, and
// returns the retry's error alone (the deadline, when the retry waited
// past it): counted here, the exchange is marked ErrDropped whatever its
// last attempt met (TestLoadingOnAnEarlierAttemptDropped).
const loadingReply = "-LOADING "

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.answered.Store(c.d.now())
		c.replyRead(b[:n])
	}
	c.note(err)
	return n, err
}

// replyRead reads b for the start of a reply: the first bytes read
// after a write begin the reply to it (go-redis reads each reply whole
// before it writes again, and closes a connection whose reply it did not
// finish).
func (c *watchedConn) replyRead(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.inReply {
		return
	}
	k := copy(c.head[c.headLen:], b)
	c.headLen += k
	switch {
	case string(c.head[:c.headLen]) != loadingReply[:c.headLen]:
		c.inReply = false
	case c.headLen == len(loadingReply):
		c.inReply = false
		c.d.n.Add(1)
	}
}

// recent reports whether the connection was answered within idleDrop:
// its close then counts.
func (c *watchedConn) recent() bool { return c.d.now()-c.answered.Load() < int64(idleDrop) }

func (c *watchedConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.inReply, c.headLen = true, 0
	c.mu.Unlock()
	n, err := c.Conn.Write(b)
	c.note(err)
	return n, err
}

func (c *watchedConn) note(err error) {
	if err != nil && !c.closed.Load() && connDrop(err) && c.recent() && !c.dropped.Swap(true) {
		c.d.n.Add(1)
	}
}

// Close counts a connection the store's end closed or reset first: the
// client closes one its check found so without reading it.
func (c *watchedConn) Close() error {
	if !c.closed.Swap(true) && !c.dropped.Load() && c.recent() && peerClosed(c.Conn) && !c.dropped.Swap(true) {
		c.d.n.Add(1)
	}
	return c.Conn.Close()
}

// watchedSysConn is a watchedConn over a syscall.Conn.
type watchedSysConn struct {
	*watchedConn
	sc syscall.Conn
}

func (c *watchedSysConn) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }
