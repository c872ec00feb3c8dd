package host

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStreamWriteDeadline: through keepAlive (with no comments), over
// HTTP/1.1 and HTTP/2, a response whose client stops reading ends within
// the write timeout, its handler's write failing and its request's
// context done; a response idle for longer than the timeout between two
// writes, or after its last (which net/http sends when the handler
// returns, with no deadline of its own: the one a write left would fail
// it), is not cut.
func TestStreamWriteDeadline(t *testing.T) {
	const timeout = time.Second
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		t.Run(proto, func(t *testing.T) {
			stuck := make(chan error, 1)
			h := keepAlive(0, timeout, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rc := http.NewResponseController(w)
				switch r.URL.Path {
				case "/idle":
					io.WriteString(w, "a\n")
					rc.Flush()
					<-time.After(2 * timeout)
					io.WriteString(w, "b\n") // buffered: sent at the end
					<-time.After(2 * timeout)
				case "/stuck":
					piece := []byte(strings.Repeat("x", 100<<10))
					for {
						if _, err := w.Write(piece); err != nil {
							<-r.Context().Done()
							stuck <- err
							return
						}
						rc.Flush()
					}
				}
			}))
			srv := serveProto(t, proto, h)
			client := srv.Client()

			get := func(path string) *http.Response {
				t.Helper()
				resp, err := client.Get(srv.URL + path)
				if err != nil {
					t.Fatal(err)
				}
				if resp.Proto != proto {
					t.Fatalf("served over %s, want %s", resp.Proto, proto)
				}
				return resp
			}
			resp := get("/idle")
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(b) != "a\nb\n" {
				t.Fatalf("a response idle for twice the write timeout: %q, %v", b, err)
			}

			resp = get("/stuck") // never read
			defer resp.Body.Close()
			select {
			case err := <-stuck:
				t.Logf("the write to a client that stopped reading: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("a response its client stopped reading was not ended")
			}
		})
	}
}

// TestLongLivedStreamQueued: through keepAlive with stream queues, over
// HTTP/1.1 and HTTP/2, a long-lived stream's writes (a GET accepting an
// event stream) never wait for its client: one whose client stops
// reading takes each write at once until its queue would pass its share,
// which ends it (its write fails, its request's context is done with
// that cause) and gives the queue's bytes back; a handler that returns
// with its writes still queued has them all sent first.
func TestLongLivedStreamQueued(t *testing.T) {
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		t.Run(proto, func(t *testing.T) {
			q := newStreamQueues(256<<10, 0, false, func(*http.Request) string { return "" })
			ended := make(chan error, 1)
			slow := make(chan time.Duration, 1)
			returned := make(chan struct{}, 1)
			opened := make(chan struct{}) // the client has the stuck stream's header
			piece := []byte(strings.Repeat("x", 8<<10))
			inner := keepAlive(0, 10*time.Second, q, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				rc := http.NewResponseController(w)
				switch r.URL.Path {
				case "/stuck":
					w.WriteHeader(http.StatusOK)
					rc.Flush()
					<-opened
					var slowest time.Duration
					for {
						start := time.Now()
						_, err := w.Write(piece)
						rc.Flush()
						slowest = max(slowest, time.Since(start))
						if err != nil {
							<-r.Context().Done()
							slow <- slowest
							ended <- context.Cause(r.Context())
							return
						}
					}
				case "/drain":
					for range 20 {
						w.Write(piece)
						rc.Flush()
					}
				}
			}))
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				inner.ServeHTTP(w, r)
				returned <- struct{}{}
			})
			srv := serveProto(t, proto, h)
			get := func(path string) *http.Response {
				t.Helper()
				req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
				req.Header.Set("Accept", "text/event-stream")
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}

			resp := get("/drain")
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || len(b) != 20*len(piece) {
				t.Fatalf("a stream whose handler returned with writes queued: %d bytes, %v; want %d", len(b), err, 20*len(piece))
			}
			<-returned

			resp = get("/stuck") // never read
			defer resp.Body.Close()
			close(opened)
			select {
			case err := <-ended:
				if !errors.Is(err, errStreamQueueFull) {
					t.Errorf("a stream its client stopped reading ended by %v, want %v", err, errStreamQueueFull)
				}
				if d := <-slow; d > time.Second {
					t.Errorf("a write to a stream its client stopped reading took %v", d)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("a stream its client stopped reading was not ended")
			}
			<-returned
			if n := q.held.sum(); n != 0 {
				t.Errorf("%d bytes still counted once the streams ended", n)
			}
		})
	}
}

// serveProto serves h on loopback over proto, HTTP/1.1 or HTTP/2.0
// (with TLS), until the test ends.
func serveProto(t *testing.T, proto string, h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	if proto == "HTTP/2.0" {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv
}

// slowReader is a client of srv whose connections have a receive
// buffer of 4 KiB: a response it does not read soon fills what the
// kernel holds for it.
func slowReader(t *testing.T, srv *httptest.Server) *http.Client {
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.DialContext = dialer.DialContext
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestLongLivedStreamNoWriteTimeoutEnds: with no write timeout
// (--stream-write-timeout 0), a long-lived stream whose client stopped
// reading, and whose handler returned with writes still queued (its
// session closed, or a newer GET of it), must still end: its queue's
// drain is bounded all the same, so that neither its goroutines nor the
// bytes it queued, counted against every client's StreamQueueBytes, are
// held for as long as the client keeps the connection.
func TestLongLivedStreamNoWriteTimeoutEnds(t *testing.T) {
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		t.Run(proto, func(t *testing.T) { testNoWriteTimeoutEnds(t, proto) })
	}
}

func testNoWriteTimeoutEnds(t *testing.T, proto string) {
	q := newStreamQueues(32<<20, 0, false, func(*http.Request) string { return "" })
	opened := make(chan struct{})
	wrote := make(chan struct{})
	returned := make(chan struct{})
	piece := []byte(strings.Repeat("x", 64<<10))
	inner := keepAlive(0, -1, q, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		<-opened
		// More than loopback's socket buffers hold: the stream's own
		// goroutine is left in a write that never goes through.
		for range 256 { // 16 MiB
			if _, err := w.Write(piece); err != nil {
				t.Errorf("a queued write failed: %v", err)
				break
			}
		}
		close(wrote)
	}))
	srv := serveProto(t, proto, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(w, r)
		close(returned)
	}))
	client := slowReader(t, srv)
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/stuck", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // never read
	close(opened)
	<-wrote
	select {
	case <-returned:
	case <-time.After(DefaultStreamWriteTimeout + 20*time.Second):
		t.Fatalf("a stuck stream's handler returned with writes queued, and never ends with no write timeout (%d bytes still counted)", q.held.sum())
	}
	if n := q.held.sum(); n != 0 {
		t.Errorf("%d bytes still counted once the stream ended", n)
	}
}

// TestStreamQueueShareWithLargeReplay: with tenants, each tenant holds a
// quarter of StreamQueueBytes however large the replay store
// (Options.MaxStreamReplayBytes, here 32 MiB): a tenant's resumption
// replays at most its share of that store, a quarter, which is all its
// queue must take at once. Bob's unread stream is written 28 MiB and must
// be ended past his quarter (8 MiB); alice's and carol's unread streams
// are then written 6 MiB each, within theirs, and must not be ended: a
// share as large as the whole replay bound let bob alone hold the total,
// and the next tenant's write past what he left ended its stream.
func TestStreamQueueShareWithLargeReplay(t *testing.T) {
	const replay = 32 << 20
	q := newStreamQueues(StreamQueueBytes, replay, true, func(r *http.Request) string { return r.Header.Get("X-Tenant") })
	opened := make(chan struct{}, 1)
	type outcome struct {
		wrote int
		err   error
	}
	results := make(chan outcome, 1)
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	piece := []byte(strings.Repeat("x", 64<<10))
	inner := keepAlive(0, time.Minute, q, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		<-opened
		want, _ := strconv.Atoi(r.URL.Query().Get("bytes"))
		var o outcome
		for o.wrote < want {
			if _, o.err = w.Write(piece); o.err != nil {
				break
			}
			o.wrote += len(piece)
		}
		results <- o
		// Unread, the stream holds what it was given until the test
		// ends (or its write deadline, a minute).
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}))
	srv := serveProto(t, "HTTP/1.1", inner)
	client := slowReader(t, srv)
	write := func(tenant string, n int) outcome {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/?bytes="+strconv.Itoa(n), nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("X-Tenant", tenant)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() }) // never read
		opened <- struct{}{}
		return <-results
	}
	if o := write("bob", 28<<20); !errors.Is(o.err, errStreamQueueFull) {
		t.Errorf("bob's unread stream took %d bytes (%v); want it ended past his quarter of %d", o.wrote, o.err, StreamQueueBytes)
	}
	for _, who := range []string{"alice", "carol"} {
		if o := write(who, 6<<20); o.err != nil {
			t.Errorf("%s's unread stream ended after %d bytes of 6 MiB, within her share: %v (%d bytes queued in all)", who, o.wrote, o.err, q.held.sum())
		}
	}
}
