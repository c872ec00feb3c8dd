package host

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
	client := &http.Client{Transport: tr}
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
