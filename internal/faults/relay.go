package faults

import (
	"bytes"
	"io"
	"net"
	"sync"
)

// Relay is a TCP relay in front of one replica: the proxy connects to the
// relay, which forwards each connection to the replica. It exists for one
// fault, a replica killed between the checkpoint of a call and its answer
// ([Relay.Trap]): a window too short to hit with a signal from outside.
// While the replica is down, the relay does not listen ([Relay.Close]), so
// the proxy's connections are refused as they would be by the dead
// replica.
type Relay struct {
	Addr   string // where it listens (the proxy's view of the replica)
	target string // the replica's own --http address

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	trap  *trap
}

// trap is an armed [Relay.Trap].
type trap struct {
	match  []byte // in a request: the connection is trapped
	sprung func() // called once the trapped connection's answer arrived
	done   chan struct{}
}

// NewRelay returns a relay from addr to target, listening.
func NewRelay(addr, target string) (*Relay, error) {
	r := &Relay{Addr: addr, target: target, conns: map[net.Conn]bool{}}
	return r, r.Open()
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
	up, err := net.Dial("tcp", r.target)
	if err != nil {
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
				if _, err := up.Write(buf[:n]); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
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
			if _, werr := down.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			if err != io.EOF {
				down.Close()
			}
			break
		}
	}
	down.Close()
	up.Close()
}
