package proxytest

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Relay is a TCP relay on a loopback port to a server, for a test that
// plays the server's or the link's faults to the server's clients (a
// Redis store's, say): as its mode says ([Relay.SetMode]) it forwards,
// swallows, resets or answers Redis's -LOADING, or cuts one answer
// ([Relay.CutAnswer]); [Relay.Stop] refuses new
// connections, and [Relay.CloseAll] and [Relay.Conn] close those it
// accepted. What it swallows is lost: unlike internal/faults' Relay,
// whose cut holds what either side sends until it heals, it plays no
// retransmission.
type Relay struct {
	ln     net.Listener
	target string
	mode   atomic.Int32

	mu    sync.Mutex
	cut   *answerCut  // armed by [Relay.CutAnswer], until it cuts
	conns []net.Conn  // the client's end of each connection, in order accepted
	ups   []net.Conn  // the target's end of each
	waits []countWait // [Relay.Accepted]'s, not yet closed
	// swallowed counts the client's sends RelaySilent swallowed;
	// swallows are [Relay.Swallowed]'s waits, not yet closed.
	swallowed int
	swallows  []countWait
}

// answerCut is an armed [Relay.CutAnswer].
type answerCut struct {
	marker    []byte
	forwarded chan struct{} // closed once the marked send was forwarded
	done      chan struct{}
	then      func() // CutAnswerThen's, or nil
}

type countWait struct {
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
	return waitFor(&r.waits, len(r.conns), n)
}

// Swallowed is closed once the relay has swallowed n of its clients'
// sends in all (reads of what a client sent, in [RelaySilent]): a test
// waits on it for an exchange to have sent into the silence, as it
// cannot wait on the answer.
func (r *Relay) Swallowed(n int) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return waitFor(&r.swallows, r.swallowed, n)
}

// waitFor is a channel closed once a count, now count, reaches n:
// closed already, or added to waits for reached. The caller holds r.mu.
func waitFor(waits *[]countWait, count, n int) <-chan struct{} {
	ch := make(chan struct{})
	if count >= n {
		close(ch)
	} else {
		*waits = append(*waits, countWait{n, ch})
	}
	return ch
}

// reached closes the channels of waits whose n count has reached, and
// keeps the others. The caller holds r.mu.
func reached(waits *[]countWait, count int) {
	kept := (*waits)[:0]
	for _, w := range *waits {
		if count >= w.n {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	*waits = kept
}

// CutAnswer arms a one-time cut: the next of the client's sends that
// holds marker is forwarded to the target, and its connection is then
// reset at both ends (an RST to the client, a FIN to the target) instead
// of forwarding the target's next answer. The target has had the whole
// send before its FIN, and answers a command only once it ran it: the
// client loses the answer of a command that ran (a write that landed),
// as when a server or the link dropped the connection just then. (A
// send that the relay reads in more than one piece is marked at the
// piece that holds marker: the answer cut may then be an earlier
// piece's, and the marked command, which the target still runs, may
// run after what the client sends next on another connection.) The
// channel is closed once the connection was cut.
func (r *Relay) CutAnswer(marker []byte) <-chan struct{} {
	return r.CutAnswerThen(marker, nil)
}

// CutAnswerThen is [Relay.CutAnswer], with then, if not nil, run once
// the target answered (so it ran the marked command) and before the
// client's connection is reset: what then does to the target (another
// client's command) comes between the marked send and the client's
// resend of it.
func (r *Relay) CutAnswerThen(marker []byte, then func()) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut = &answerCut{marker: bytes.Clone(marker), forwarded: make(chan struct{}), done: make(chan struct{}), then: then}
	return r.cut.done
}

// cutting takes the armed cut if what the client sent holds its marker.
func (r *Relay) cutting(sent []byte) *answerCut {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cut == nil || !bytes.Contains(sent, r.cut.marker) {
		return nil
	}
	c := r.cut
	r.cut = nil
	return c
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
		reached(&r.waits, len(r.conns))
		r.mu.Unlock()
		var cut atomic.Pointer[answerCut] // the connection's, once its send was marked
		go r.up(c, u, &cut)
		go r.down(c, u, &cut)
	}
}

// up forwards what the client sends, as the mode says.
func (r *Relay) up(c, u net.Conn, cut *atomic.Pointer[answerCut]) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if err != nil {
			u.Close()
			return
		}
		switch RelayMode(r.mode.Load()) {
		case RelayPass:
			// Marked before it is forwarded, so that down cuts its
			// answer, and down closes the target's end only once it
			// was forwarded whole.
			ac := r.cutting(buf[:n])
			if ac != nil {
				cut.Store(ac)
			}
			u.Write(buf[:n])
			if ac != nil {
				close(ac.forwarded)
			}
		case RelayReset:
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			u.Close()
			return
		case RelaySilent:
			r.mu.Lock()
			r.swallowed++
			reached(&r.swallows, r.swallowed)
			r.mu.Unlock()
		case RelayLoading:
			c.Write([]byte("-LOADING Redis is loading the dataset in memory\r\n"))
		}
	}
}

// down forwards what the server answers while the mode is RelayPass,
// until a cut (CutAnswer).
func (r *Relay) down(c, u net.Conn, cut *atomic.Pointer[answerCut]) {
	buf := make([]byte, 32<<10)
	for {
		n, err := u.Read(buf)
		if err != nil {
			c.Close()
			return
		}
		if ac := cut.Load(); ac != nil {
			if ac.then != nil {
				ac.then()
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			<-ac.forwarded
			u.Close()
			close(ac.done)
			return
		}
		if RelayMode(r.mode.Load()) == RelayPass {
			c.Write(buf[:n])
		}
	}
}
