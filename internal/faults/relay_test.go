package faults

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestRelay: the relay forwards requests and answers; armed, it holds back
// the answer to the request that matches, calls sprung once that answer
// has arrived whole (the replica ran the request), and closes: the client
// gets no answer, and the next connection is refused.
func TestRelay(t *testing.T) {
	var ran atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ran.Add(1)
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"echo":`+string(b)+`}}`)
	}))
	defer srv.Close()
	rl, err := NewRelay(proxytest.FreeAddr(t), strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	post := func(body string) (string, error) {
		res, err := http.Post("http://"+rl.Addr+"/mcp", "application/json", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return string(b), err
	}
	if got, err := post(`"one"`); err != nil || !strings.Contains(got, `"echo":"one"`) {
		t.Fatalf("through the relay: %q, %v", got, err)
	}
	var sprung atomic.Int32
	done := rl.Trap(`"note_add"`, func() { sprung.Add(1) })
	if got, err := post(`"two"`); err != nil || !strings.Contains(got, `"echo":"two"`) {
		t.Fatalf("a request the trap does not match: %q, %v", got, err)
	}
	if got, err := post(`"note_add"`); err == nil {
		t.Fatalf("the trapped request was answered: %q", got)
	}
	<-done
	if sprung.Load() != 1 || ran.Load() != 3 {
		t.Fatalf("sprung %d times, the server ran %d requests; want 1 and 3", sprung.Load(), ran.Load())
	}
	if _, err := post(`"three"`); err == nil {
		t.Fatal("the relay still listens after its trap sprang")
	}
}
