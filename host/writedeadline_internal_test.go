package host

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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
			h := keepAlive(0, timeout, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
			srv := httptest.NewUnstartedServer(h)
			if proto == "HTTP/2.0" {
				srv.EnableHTTP2 = true
				srv.StartTLS()
			} else {
				srv.Start()
			}
			t.Cleanup(srv.Close)
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
