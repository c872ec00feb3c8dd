package host

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// MaxConnections is the default bound on the connections the HTTP
// listener holds at once for a server of maxSessions stateful sessions
// (0: [DefaultMaxSessions]): a standing stream for each (a session's GET
// stream, or a 2026-07-28 client's subscriptions/listen, which the same
// number bounds), the connection its client's requests take beside it,
// and 1,024 for calls in flight and clients between requests. 9,216 at
// the defaults.
func MaxConnections(maxSessions int) int {
	if maxSessions <= 0 {
		maxSessions = DefaultMaxSessions
	}
	return 2*maxSessions + 1024
}

// refusedResponse is what a connection past the bound reads before it is
// closed: a request's answer it can show, whatever it sent, and that
// proxies retry elsewhere (HAProxy's retry-on 503, nginx's
// proxy_next_upstream http_503), as for a draining replica.
const refusedResponse = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 21\r\n\r\ntoo many connections\n"

// LimitConnections returns ln bounded to max connections open at once
// (max > 0). A connection accepted past it is answered refusedResponse
// and closed at once, never handed to the server, rather than left in
// the listener's backlog, where the clients' and the proxies' timeouts
// would be all that told of it. Refusals are counted in h's metrics
// (wasmtools_http_connections_refused_total, when h is not nil) and
// logged once per burst: at the first, and, with their number, at the
// next connection accepted.
//
// Accept must be called from one goroutine at a time (http.Server's
// loop); the connections may be closed from any.
func LimitConnections(ln net.Listener, max int, log *slog.Logger, h *Host) net.Listener {
	l := &limitListener{Listener: ln, max: int64(max), log: log}
	if h != nil {
		l.refused = h.metrics.connsRefused.Inc
		h.metrics.setConnections(l.open.Load)
	}
	return l
}

type limitListener struct {
	net.Listener
	max     int64
	log     *slog.Logger
	refused func()
	open    atomic.Int64
	burst   int // refused since the last connection accepted (Accept's goroutine only)
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			if l.burst > 0 {
				l.log.Info("connections accepted again", "refused", l.burst, "max_connections", l.max)
				l.burst = 0
			}
			return &limitedConn{Conn: c, open: &l.open}, nil
		}
		l.open.Add(-1)
		if l.burst == 0 {
			l.log.Warn("connections refused: the server holds --max-connections (http.max_connections) already; each is answered 503 and closed",
				"max_connections", l.max, "peer", c.RemoteAddr().String())
		}
		l.burst++
		if l.refused != nil {
			l.refused()
		}
		// A new connection's send buffer is empty: the write does not
		// wait for the peer, and the deadline only bounds a broken one.
		c.SetWriteDeadline(time.Now().Add(time.Second))
		c.Write([]byte(refusedResponse))
		c.Close()
	}
}

// limitedConn gives its slot back at its first Close (net/http may close
// a connection more than once).
type limitedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

// CloseWrite is the TCP connection's: net/http half-closes a connection
// it ends after an answer (a 413, a 431) and waits a moment before it
// closes it, so that the client reads the answer rather than a reset, but
// only on a connection that has the method.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.open.Add(-1) })
	return err
}
