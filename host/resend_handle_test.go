package host_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// At most once for a 2026-07-28 client too: a proxy's resend of a
// keyless tools/call POST of a handle, whose first run at a completed and
// was saved but whose answer never reached the proxy (a replica stopped
// between its checkpoint and its answer, past the proxy's timeout:
// nginx's 504 and HAProxy's response-timeout resend it to the
// fallback), reaches b, which must answer with the first result rather
// than run the call again, as TestCallAppliedAtMostOnce asks of a
// 2025-11-25 session. The fault suite's sigstop-past-proxy behind nginx
// applied such a call twice ("note 3 saved" after one note, the note
// twice in the list). The proxy names the client's request
// (X-Request-Id, the same on its resend), as deploy/'s configs
// do; the same body under another request ID (a client that reconnected,
// its JSON-RPC ids started over) is a new call, and runs. A real
// redis-server shared by a and b.
func TestHandleCallResentByProxyAppliedOnce(t *testing.T) {
	addr := proxytest.StartRedis(t)
	r := &cutRedis{addr: addr}
	a, b := r.serve(t, "a", redisStore(t, addr)), r.serve(t, "b", redisStore(t, addr))
	logsOnFailure(t, a, b)
	proxy := &resender{match: []byte(`"once"`), again: b.srv.URL}
	cs := connectHTTP(t, a.srv.URL, "", proxy)
	cs.ListTools(context.Background(), nil)
	first := call(t, cs, "note_add", map[string]any{"text": "first"})
	handle, _ := first.Meta[host.MetaSession].(string)
	if handle == "" || first.IsError {
		t.Fatalf("first call: %v %q; want a handle", first.Meta, text(first))
	}
	res := call(t, cs, "note_add", map[string]any{"text": "once", host.SessionArgument: handle})
	if !proxy.resent.Load() {
		t.Fatal("the call was not resent")
	}
	if res.IsError || !strings.Contains(text(res), "note 2 saved") {
		t.Fatalf("the resent call at b: %v %q; want the first result, note 2 saved", res.Meta, text(res))
	}
	list := call(t, cs, "note_list", map[string]any{host.SessionArgument: handle})
	if n := strings.Count(text(list), "once"); n != 1 {
		t.Fatalf("the resent call was applied %d times: %q", n, text(list))
	}
	// The same POST, body and all, as a new client request.
	if got := proxy.sendAgain(t, rand.Text()); !strings.Contains(got, "note 3 saved") {
		t.Fatalf("the same body under a new request ID: %q; want it run, note 3 saved", got)
	}
	list = call(t, cs, "note_list", map[string]any{host.SessionArgument: handle})
	if n := strings.Count(text(list), "once"); n != 2 {
		t.Fatalf("after the same body under a new request ID, the note is there %d times, want 2: %q", n, text(list))
	}
}

// resender is a proxy that names each request it passes on by an ID of
// its own (X-Request-Id, as deploy/'s configs set it), sends the first POST whose body holds
// match to its replica, reads its answer whole and drops it, and sends
// the same request (headers, ID and body) again to the replica at again,
// whose answer the client gets; from then on every request goes there.
type resender struct {
	match  []byte
	again  string
	resent atomic.Bool
	first  *http.Request // the POST resent, and its body
	body   []byte
}

func (p *resender) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(requestIDHeader, rand.Text())
	if p.resent.Load() {
		return http.DefaultTransport.RoundTrip(p.to(req, nil))
	}
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	first := req.Clone(req.Context())
	first.Body = io.NopCloser(bytes.NewReader(body))
	if req.Method != http.MethodPost || !bytes.Contains(body, p.match) {
		return http.DefaultTransport.RoundTrip(first)
	}
	res, err := http.DefaultTransport.RoundTrip(first)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	p.first, p.body = req, body
	p.resent.Store(true)
	return http.DefaultTransport.RoundTrip(p.to(req, body))
}

// to is req sent to the replica at p.again, with body (else req's own).
func (p *resender) to(req *http.Request, body []byte) *http.Request {
	u, _ := url.Parse(p.again)
	out := req.Clone(req.Context())
	out.URL.Scheme, out.URL.Host, out.Host = u.Scheme, u.Host, u.Host
	if body != nil {
		out.Body = io.NopCloser(bytes.NewReader(body))
	}
	return out
}

// sendAgain sends the POST that was resent once more, to the replica at
// p.again, under request ID id, and returns its answer.
func (p *resender) sendAgain(t *testing.T, id string) string {
	t.Helper()
	req := p.to(p.first.Clone(context.Background()), p.body)
	req.Header.Set(requestIDHeader, id)
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// requestIDHeader is the header deploy/'s proxies name a client's request
// by, on every request they pass on to a replica.
const requestIDHeader = "X-Request-Id"
