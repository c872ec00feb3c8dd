package host_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestStreamKeepAlive: a call that is silent for long (here a guest
// spinning until its 1 s deadline) keeps its stream from falling silent:
// it carries SSE comments every StreamKeepAlive, from before its first
// event (a 2026-07-28 stream is committed by the first comment, not by
// the result), so that a proxy's read timeout fails over only a replica
// that writes nothing (deploy/nginx.conf). Clients of both eras read the
// result as usual.
func TestStreamKeepAlive(t *testing.T) {
	f := newFixture(t, &host.Options{StreamKeepAlive: 100 * time.Millisecond}, sandbox.NewPolicy().WithCallTimeout(time.Second),
		map[string]string{"loop.wasm": testplugins.Test(t, "loop")})
	url := serveHTTP(t, f)

	t.Run("2026-07-28 stream committed by its first comment", func(t *testing.T) {
		body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"spin","arguments":{},` +
			`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
		req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "spin")
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		// The headers come with the first comment, long before the
		// guest's deadline ends the call.
		if d := time.Since(start); resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("after %v: %d %q; want 200, an event stream", d, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		comments, data := 0, ""
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			switch l := sc.Text(); {
			case l == ": keepalive" && data == "":
				comments++
			case strings.HasPrefix(l, "data: "):
				data = strings.TrimPrefix(l, "data: ")
			}
		}
		if comments < 3 {
			t.Errorf("%d comments during a call of about 1 s, every 100 ms; want several", comments)
		}
		if !strings.Contains(data, `"id":7`) || !strings.Contains(data, `"result"`) {
			t.Errorf("result event %q; want the call's result", data)
		}
	})

	for _, era := range []string{"2025-11-25", "2026-07-28"} {
		t.Run("go-sdk client "+era, func(t *testing.T) {
			comments := &countingTransport{}
			cs := connectHTTP(t, url, era, comments)
			cs.ListTools(context.Background(), nil)
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
			if err != nil {
				t.Fatalf("spin: %v", err)
			}
			if !res.IsError || !strings.Contains(text(res), "deadline") && !strings.Contains(text(res), "timed out") && !strings.Contains(text(res), "time") {
				t.Errorf("spin: %q; want the deadline's error", text(res))
			}
			if comments.n() == 0 {
				t.Error("no keepalive comment reached the client")
			}
		})
	}
}

// countingTransport counts the keepalive comments in the responses it
// carries.
type countingTransport struct {
	mu    sync.Mutex
	count int
}

func (c *countingTransport) n() int { c.mu.Lock(); defer c.mu.Unlock(); return c.count }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &commentCounter{ReadCloser: resp.Body, c: c}
	return resp, nil
}

type commentCounter struct {
	io.ReadCloser
	c    *countingTransport
	tail string
}

func (r *commentCounter) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	s := r.tail + string(p[:n])
	k := strings.Count(s, ": keepalive\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		r.tail = s[i+1:]
	} else {
		r.tail = s
	}
	r.c.mu.Lock()
	r.c.count += k
	r.c.mu.Unlock()
	return n, err
}
