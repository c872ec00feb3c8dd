package proxytest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Relay is a TCP relay on a loopback port to a server, for a test that
// plays the server's or the link's faults to the server's clients (a
// Redis store's, say): as its mode says ([Relay.SetMode]) it forwards,
// swallows, resets or answers Redis's -LOADING; [Relay.Stop] refuses new
// connections, and [Relay.CloseAll] and [Relay.Conn] close those it
// accepted. What it swallows is lost: unlike internal/faults' Relay,
// whose cut holds what either side sends until it heals, it plays no
// retransmission.
type Relay struct {
	ln     net.Listener
	target string
	mode   atomic.Int32

	mu    sync.Mutex
	conns []net.Conn // the client's end of each connection, in order accepted
	ups   []net.Conn // the target's end of each
	waits []accepted // [Relay.Accepted]'s, not yet closed
}

type accepted struct {
	n  int
	ch chan struct{}
}

// RelayMode is what a [Relay] does with what either side sends.
type RelayMode int32

const (
	// RelayPass forwards both ways (a relay's first mode).
	RelayPass RelayMode = iota
	// RelaySilent swallows what either side sends: connections stay
	// open, and new ones are accepted, connected to the target and
	// swallowed too (a server frozen, a link blackholed).
	RelaySilent
	// RelayReset resets each connection, with an RST, when its client
	// next sends.
	RelayReset
	// RelayLoading answers each read of what the client sends with
	// Redis's -LOADING error (a Redis restarted, loading its data), and
	// swallows the server's answers. One answer a read holds for a
	// go-redis client, which writes each command whole.
	RelayLoading
)

// StartRelay starts a relay to target (host:port) on a free loopback
// port, stopped and its connections closed when the test ends.
func StartRelay(t testing.TB, target string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{ln: ln, target: target}
	t.Cleanup(func() { r.Stop(); r.CloseAll() })
	go r.accept()
	return r
}

// Addr is where the relay listens, 127.0.0.1:PORT.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// SetMode sets what the relay does from now on with what either side
// sends, on the connections it accepted and those it will.
func (r *Relay) SetMode(m RelayMode) { r.mode.Store(int32(m)) }

// Stop stops listening: dials are refused (a server gone down). The
// connections accepted stay as they are.
func (r *Relay) Stop() { r.ln.Close() }

// CloseAll closes every connection accepted so far, at both ends: the
// clients see a FIN.
func (r *Relay) CloseAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.conns {
		r.conns[i].Close()
		r.ups[i].Close()
	}
}

// Conn is the client's end of the i-th connection accepted, from 0:
// closing it closes the connection (the client sees a FIN).
func (r *Relay) Conn(i int) net.Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns[i]
}

// Accepted is closed once the relay has accepted n connections in all
// (and connected each to the target): a test waits on it for a client's
// dial.
func (r *Relay) Accepted(n int) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan struct{})
	if len(r.conns) >= n {
		close(ch)
	} else {
		r.waits = append(r.waits, accepted{n, ch})
	}
	return ch
}

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns, r.ups = append(r.conns, c), append(r.ups, u)
		waits := r.waits[:0]
		for _, w := range r.waits {
			if len(r.conns) >= w.n {
				close(w.ch)
			} else {
				waits = append(waits, w)
			}
		}
		r.waits = waits
		r.mu.Unlock()
		go r.up(c, u)
		go r.down(c, u)
	}
}

// up forwards what the client sends, as the mode says.
func (r *Relay) up(c, u net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if err != nil {
			u.Close()
			return
		}
		switch RelayMode(r.mode.Load()) {
		case RelayPass:
			u.Write(buf[:n])
		case RelayReset:
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			u.Close()
			return
		case RelayLoading:
			c.Write([]byte("-LOADING Redis is loading the dataset in memory\r\n"))
		}
	}
}

// down forwards what the server answers while the mode is RelayPass.
func (r *Relay) down(c, u net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := u.Read(buf)
		if err != nil {
			c.Close()
			return
		}
		if RelayMode(r.mode.Load()) == RelayPass {
			c.Write(buf[:n])
		}
	}
}
