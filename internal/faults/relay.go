package faults

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Relay is a TCP relay in front of one replica, or between a replica and
// Redis: the proxy (or the replica) connects to the relay, which forwards
// each connection to its target. In front of a replica it exists for one
// fault, a replica killed between the checkpoint of a call and its answer
// ([Relay.Trap]): a window too short to hit with a signal from outside.
// While the replica is down, the relay does not listen ([Relay.Close]), so
// the proxy's connections are refused as they would be by the dead
// replica. Either relay can be cut ([Relay.Cut]), as a network partition
// blackholes packets.
type Relay struct {
	Addr   string // where it listens (the proxy's view of the replica)
	target string // the replica's own --http address, or Redis's
	// refused is what a connection is answered when the target refuses
	// it (nil: it is closed).
	refused []byte

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	trap  *trap
	open  chan struct{} // closed while not cut
	held  int           // bytes waiting for the cut to heal
	heldN int           // sends (a chunk, a close) waiting for it
	slow  time.Duration // each send waits between slow/2 and slow (0: none)
}

// trap is an armed [Relay.Trap].
type trap struct {
	match  []byte // in a request: the connection is trapped
	sprung func() // called once the trapped connection's answer arrived
	done   chan struct{}
}

// NewRelay returns a relay from addr to target, listening.
func NewRelay(addr, target string) (*Relay, error) {
	return newRelay(addr, target, nil)
}

// NewHTTPRelay returns a relay in front of an HTTP server at target,
// listening at addr. A connection it accepted while the server refuses
// connections (it exited, or closed its listener to exit) is answered
// 503, which the proxies send on to another replica as they would the
// refused connection: without it, the proxy would see a connection closed
// after its request was sent, which may have run (nginx answers the
// client 502), though nothing reached the server.
func NewHTTPRelay(addr, target string) (*Relay, error) {
	return newRelay(addr, target, []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
}

func newRelay(addr, target string, refused []byte) (*Relay, error) {
	r := &Relay{Addr: addr, target: target, refused: refused, conns: map[net.Conn]bool{}, open: make(chan struct{})}
	close(r.open)
	return r, r.Open()
}

// Cut stops forwarding in both directions without closing anything, as a
// partition that drops packets does: connections stay open, what either
// side sends is held (in the relay and the kernel's buffers, as TCP
// retransmits it), and new connections are accepted but not forwarded
// (a connect that does not fail, and nothing answers). [Relay.Heal]
// delivers everything held, in order, closes included: a request sent
// during the cut reaches its target late, as a retransmission after the
// partition heals does, though its sender gave up on it.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.open:
		r.open = make(chan struct{})
	default:
	}
}

// Heal undoes [Relay.Cut], and returns how many sends (chunks of data,
// closes and connects) and bytes the cut held, which are now delivered.
func (r *Relay) Heal() (sends, bytes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.open:
	default:
		close(r.open)
	}
	sends, bytes = r.heldN, r.held
	r.heldN, r.held = 0, 0
	return sends, bytes
}

// Slow delays everything the relay sends on, in both directions, each
// send (a chunk, a close, a connect) by between d/2 and d, in order on
// its connection, as a congested or lossy link's latency does: a
// request and its answer take between d and 2d more. 0 ends it.
func (r *Relay) Slow(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slow = d
}

// pass waits while the relay is cut, and a slow relay's delay: before
// anything (n bytes, or a close or connect) is sent on.
func (r *Relay) pass(n int) {
	r.mu.Lock()
	if d := r.slow; d > 0 {
		r.mu.Unlock()
		time.Sleep(d/2 + rand.N(d/2+1)) // the fault's latency, not a wait for a state
		r.mu.Lock()
	}
	open := r.open
	select {
	case <-open:
		r.mu.Unlock()
		return
	default:
	}
	r.heldN++
	r.held += n
	r.mu.Unlock()
	<-open
}

// Open listens again at r.Addr (after [Relay.Close]).
func (r *Relay) Open() error {
	ln, err := net.Listen("tcp", r.Addr)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.ln = ln
	r.mu.Unlock()
	go r.accept(ln)
	return nil
}

// Close stops listening and ends every relayed connection.
func (r *Relay) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Close()
	}
}

// Trap arms the relay: the next connection whose request bytes contain
// match is trapped. The replica's answer to it is held back; once it has
// arrived (a JSON-RPC "result" or "error" in what it sent), which with
// `--checkpoint after-call` means the call's state was written to the
// store, sprung is called (it kills the replica), the relay closes (see
// [Relay.Close]) and the proxy is left with a connection closed without
// an answer. The returned channel is closed after sprung returned.
func (r *Relay) Trap(match string, sprung func()) <-chan struct{} {
	t := &trap{match: []byte(match), sprung: sprung, done: make(chan struct{})}
	r.mu.Lock()
	r.trap = t
	r.mu.Unlock()
	return t.done
}

func (r *Relay) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go r.relay(c)
	}
}

func (r *Relay) track(c net.Conn, on bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on && r.ln == nil {
		return false
	}
	if on {
		r.conns[c] = true
	} else {
		delete(r.conns, c)
	}
	return true
}

func (r *Relay) relay(down net.Conn) {
	r.pass(0)
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		if r.refused != nil {
			// Answered once the request's head has come (an answer
			// before the request is no answer to it), and whole
			// before the close: a close with the request unread would
			// reset the connection, and the answer with it.
			down.SetReadDeadline(time.Now().Add(5 * time.Second))
			var head []byte
			buf := make([]byte, 4<<10)
			for !bytes.Contains(head, []byte("\r\n\r\n")) {
				n, err := down.Read(buf)
				head = append(head, buf[:n]...)
				if err != nil {
					break
				}
			}
			down.Write(r.refused)
			down.(*net.TCPConn).CloseWrite()
			io.Copy(io.Discard, down)
		}
		down.Close()
		return
	}
	if !r.track(down, true) || !r.track(up, true) {
		down.Close()
		up.Close()
		return
	}
	defer r.track(down, false)
	defer r.track(up, false)
	var trapped *trap // set by the request direction, read by the answer's
	var tmu sync.Mutex
	go func() {
		buf := make([]byte, 32<<10)
		var seen []byte
		for {
			n, err := down.Read(buf)
			if n > 0 {
				r.mu.Lock()
				t := r.trap
				if t != nil {
					seen = append(seen, buf[:n]...)
					if bytes.Contains(seen, t.match) {
						r.trap = nil
						tmu.Lock()
						trapped = t
						tmu.Unlock()
					}
					if len(seen) > 1<<20 {
						seen = seen[len(seen)-1<<10:]
					}
				}
				r.mu.Unlock()
				r.pass(n)
				if _, err := up.Write(buf[:n]); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		r.pass(0)
		up.(*net.TCPConn).CloseWrite()
	}()
	buf := make([]byte, 32<<10)
	var held []byte
	for {
		n, err := up.Read(buf)
		tmu.Lock()
		t := trapped
		tmu.Unlock()
		if t != nil {
			held = append(held, buf[:n]...)
			if bytes.Contains(held, []byte(`"result"`)) || bytes.Contains(held, []byte(`"error"`)) {
				t.sprung()
				r.Close() // ends down without the answer
				close(t.done)
				return
			}
		} else if n > 0 {
			r.pass(n)
			if _, werr := down.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			r.pass(0)
			if err != io.EOF {
				down.Close()
			}
			break
		}
	}
	r.pass(0)
	down.Close()
	up.Close()
}
