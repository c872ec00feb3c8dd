package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// testOperatorToken is the operator's token in the tests.
const testOperatorToken = "operator-token-0123456789"

// operatorRequest sends method path to base with token (if any) and
// returns the status, the WWW-Authenticate header and the body.
func operatorRequest(t *testing.T, base, method, path, token string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), b.String()
}

// TestOperatorEndpoints: with an operator credential configured, /drain,
// /reload, /status and /metrics answer only to it (the operator's token,
// or an operator subject's); a tenant's token is refused with 403
// insufficient_scope, none with 401 (issue 26: any tenant's token POSTed
// /drain and the server exited, read /status and triggered /reload).
func TestOperatorEndpoints(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfg, []byte(`
[http]
operator_subjects = ["ops"]
[http.tokens]
alice = "alice-token-0123456789"
ops = "ops-token-0123456789ab"
`), 0o644)
	env := map[string]string{"WASMTOOLS_OPERATOR_TOKEN": testOperatorToken}
	base, stderr := serveInProcess(t, env, "--no-watch", "--config", cfg, dir)

	type req struct{ method, path string }
	endpoints := []req{{"POST", "/drain"}, {"POST", "/reload"}, {"GET", "/status"}, {"GET", "/metrics"}}
	for _, e := range endpoints {
		t.Run("tenant"+e.path, func(t *testing.T) {
			code, challenge, body := operatorRequest(t, base, e.method, e.path, "alice-token-0123456789")
			if code != http.StatusForbidden || !strings.Contains(challenge, `error="insufficient_scope"`) {
				t.Errorf("alice: %d %q, want 403 insufficient_scope", code, challenge)
			}
			if strings.Contains(body, "counter") {
				t.Errorf("the refusal gives plugin details away: %s", body)
			}
		})
		t.Run("no token"+e.path, func(t *testing.T) {
			code, challenge, _ := operatorRequest(t, base, e.method, e.path, "")
			if code != http.StatusUnauthorized || !strings.HasPrefix(challenge, "Bearer") {
				t.Errorf("no token: %d %q, want 401 Bearer", code, challenge)
			}
		})
		t.Run("wrong token"+e.path, func(t *testing.T) {
			code, challenge, _ := operatorRequest(t, base, e.method, e.path, "guess-guess-guess-guess")
			if code != http.StatusUnauthorized || !strings.Contains(challenge, `error="invalid_token"`) {
				t.Errorf("wrong token: %d %q, want 401 invalid_token", code, challenge)
			}
		})
	}
	// The tenants' own endpoint is theirs, not the operator's alone.
	if code, _ := guardRequest(t, base, "/mcp", func(r *http.Request) { r.Header.Set("Authorization", "Bearer alice-token-0123456789") }); code != http.StatusOK {
		t.Fatalf("alice on /mcp: %d", code)
	}
	// The operator's token and an operator subject's.
	for _, tok := range []string{testOperatorToken, "ops-token-0123456789ab"} {
		for _, e := range endpoints[1:] {
			if code, _, body := operatorRequest(t, base, e.method, e.path, tok); code != http.StatusOK {
				t.Errorf("operator %s %s: %d %s", e.method, e.path, code, body)
			}
		}
	}
	// `wasmtools status` sends WASMTOOLS_OPERATOR_TOKEN.
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"status", "--url", base}, lookup(env), nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "counter") {
		t.Fatalf("status with the operator's token: exit %d\n%s%s", code, out.String(), errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := run(context.Background(), []string{"status", "--url", base}, nil, nil, &out, &errb); code == 0 {
		t.Fatalf("status without the operator's token: exit 0\n%s", out.String())
	}
	// Probes say nothing a tenant could use.
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready\n"} {
		if code, _, body := operatorRequest(t, base, "GET", path, ""); code != http.StatusOK || body != want {
			t.Errorf("%s: %d %q, want %q", path, code, body, want)
		}
	}
	// Still serving after every tenant's attempt; the operator drains it.
	if code, _, _ := operatorRequest(t, base, "POST", "/drain", testOperatorToken); code != http.StatusAccepted {
		t.Fatalf("operator POST /drain: %d", code)
	}
	stderr.waitFor(time.Now().Add(time.Minute), contains("msg=draining"))
	if !strings.Contains(stderr.String(), "msg=draining") {
		t.Fatalf("not drained after the operator's POST /drain:\n%s", stderr.String())
	}
}

// TestOperatorConfigRefused: an operator token that is also a tenant's is
// refused at start.
func TestOperatorConfigRefused(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfg, []byte(`
[http.tokens]
alice = "`+testOperatorToken+`"
`), 0o644)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"serve", "--no-watch", "--http", freeAddr(t), "--config", cfg, dir}, lookup(map[string]string{"WASMTOOLS_OPERATOR_TOKEN": testOperatorToken}), strings.NewReader(""), &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "also a tenant's") {
		t.Fatalf("exit %d, want 1 and the reason:\n%s", code, errb.String())
	}
}

// TestLocalRequest: without an operator credential, /status and /metrics
// answer a loopback peer that no proxy forwarded, and no one else.
func TestLocalRequest(t *testing.T) {
	tests := []struct {
		name   string
		remote string
		header string
		want   bool
	}{
		{"loopback v4", "127.0.0.1:5000", "", true},
		{"loopback v6", "[::1]:5000", "", true},
		{"v4-mapped loopback", "[::ffff:127.0.0.1]:5000", "", true},
		{"another machine", "10.1.2.3:5000", "", false},
		{"forwarded by a proxy here", "127.0.0.1:5000", "X-Forwarded-For", false},
		{"Forwarded", "127.0.0.1:5000", "Forwarded", false},
		{"X-Real-IP", "127.0.0.1:5000", "X-Real-IP", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/status", nil)
			r.RemoteAddr = tt.remote
			if tt.header != "" {
				r.Header.Set(tt.header, "203.0.113.7")
			}
			if got := localRequest(r); got != tt.want {
				t.Errorf("localRequest = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestGuestRequestIsNotLocal: without an operator credential, /status and
// /metrics answer requests made on this machine; a guest's http_request to
// the server's own port is made by this process on a tenant's behalf, not
// by someone on the machine, and is refused like any other tenant's. A
// red team (round four) had bob, whose plugin was granted the server's
// loopback port (as a hyper-mcp "127.0.0.1" or "localhost" entry grants
// every port of it), read /status (every plugin's path and hash, every
// session's grant counts) and /metrics (every tenant's usage) through
// his own tool call.
func TestGuestRequestIsNotLocal(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"grants.wasm": testplugins.Test(t, "grants")})
	addr := freeAddr(t)
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`
[http.tokens]
bob = "bob-token-0123456789abc"
[plugins.grants]
allowed_hosts = [%q]
allow_private_networks = true
`, addr)), 0o644)
	// A second --http wins over serveInProcess's own: the grant names it.
	serveInProcess(t, nil, "--no-watch", "--config", cfg, "--http", addr, dir)
	base := "http://" + addr
	// The machine's own requests are served (the rule the guest must not
	// pass for).
	if code, _, body := operatorRequest(t, base, "GET", "/status", ""); code != http.StatusOK || !strings.Contains(body, "grants") {
		t.Fatalf("/status from this machine: %d %s", code, body)
	}
	cs, err := connectURL(t, base, bearer("bob-token-0123456789abc"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/status", "/metrics"} {
		got := callText(t, cs, "fetch", map[string]any{"url": base + path})
		if !strings.HasPrefix(got, "403 ") {
			t.Errorf("bob's guest fetched %s: %.300q, want 403", path, got)
		}
	}
	// The guest still reaches what it was granted: the port, as a client.
	if got := callText(t, cs, "fetch", map[string]any{"url": base + "/healthz"}); got != "200 ok" {
		t.Errorf("bob's guest fetched /healthz: %q, want 200 ok", got)
	}
}

// TestReloadSaysWhyRefused: `wasmtools reload` and `status` refused by the
// server print the server's reason and where the token comes from, not a
// bare status line.
func TestReloadSaysWhyRefused(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	open, _ := serveInProcess(t, nil, "--no-watch", dir)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"reload", "--url", open}, lookup(nil), nil, &out, &errb); code != 1 || !strings.Contains(errb.String(), "without an operator credential (http.operator_token)") {
		t.Errorf("reload of a server with no operator credential: exit %d\n%s", code, errb.String())
	}
	guarded, _ := serveInProcess(t, map[string]string{"WASMTOOLS_OPERATOR_TOKEN": testOperatorToken}, "--no-watch", dir)
	errb.Reset()
	if code := run(context.Background(), []string{"status", "--url", guarded}, lookup(nil), nil, &out, &errb); code != 1 || !strings.Contains(errb.String(), "set WASMTOOLS_OPERATOR_TOKEN") {
		t.Errorf("status with no token: exit %d\n%s", code, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"status", "--url", guarded}, lookup(map[string]string{"WASMTOOLS_OPERATOR_TOKEN": "wrong-token-0123456789"}), nil, &out, &errb); code != 1 || !strings.Contains(errb.String(), "not this server's operator credential") {
		t.Errorf("status with a wrong token: exit %d\n%s", code, errb.String())
	}
}
