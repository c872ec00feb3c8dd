package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/wasmtools/wasmtools/internal/auth/authtest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// serveOAuth serves the counter plugin as an OAuth resource server of
// as, with the given extra [http] and [http.oauth] lines, and returns its
// base URL and resource URI.
func serveOAuth(t *testing.T, httpLines, oauthLines string) (base, resource string, as *authtest.Server) {
	t.Helper()
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	addr := freeAddr(t)
	base = "http://" + addr
	resource = base + "/mcp"
	as = authtest.NewServer(t, resource)
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`
[http]
%s
[http.oauth]
issuer = %q
resource = %q
%s
`, httpLines, as.URL, resource, oauthLines)), 0o644)
	serveInProcess(t, nil, "--no-watch", "--config", cfg, "--http", addr, dir)
	return base, resource, as
}

// TestOAuthResourceServer: wasmtools as an OAuth 2.1 resource server per
// the MCP authorization specification, end to end over HTTP: its
// protected resource metadata (RFC 9728) names the authorization server;
// a go-sdk client with golang.org/x/oauth2 gets a token by client
// credentials and lists and calls tools; every bad token is refused with
// 401 and a WWW-Authenticate challenge pointing at the metadata, a token
// lacking the required scope with 403 insufficient_scope.
func TestOAuthResourceServer(t *testing.T) {
	base, resource, as := serveOAuth(t, `operator_scope = "wasmtools:operate"`, "scopes = [\"tools\"]\nkeys_min_refresh = \"1ms\"")
	metadataURL := base + "/.well-known/oauth-protected-resource/mcp"

	// The metadata, as an MCP client discovers it (the go-sdk's oauthex,
	// which checks that it names the resource), also cross-origin.
	prm, err := oauthex.GetProtectedResourceMetadata(context.Background(), metadataURL, resource, http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	if len(prm.AuthorizationServers) != 1 || prm.AuthorizationServers[0] != as.URL || strings.Join(prm.ScopesSupported, " ") != "tools" {
		t.Errorf("metadata %+v, want the authorization server %s and scope tools", prm, as.URL)
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/.well-known/oauth-protected-resource", nil)
	req.Header.Set("Origin", "http://inspector.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != http.StatusOK || res.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("cross-origin metadata: %v %v", err, res)
	}

	// A real client: client credentials at the token endpoint, the
	// resource indicator (RFC 8707) naming this server.
	as.AddClient("agent", "agent-secret")
	cc := clientcredentials.Config{ClientID: "agent", ClientSecret: "agent-secret", TokenURL: as.URL + "/token", Scopes: []string{"tools"},
		EndpointParams: map[string][]string{"resource": {resource}}}
	httpClient := cc.Client(context.Background())
	tr := &mcp.StreamableClientTransport{Endpoint: resource, HTTPClient: httpClient}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) == 0 {
		t.Fatalf("list: %v %+v", err, tools)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count"})
	if err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}

	challenge := func(token string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, resource, strings.NewReader(initializeBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode, res.Header.Get("WWW-Authenticate")
	}
	now := time.Now()
	stranger := authtest.NewRSAKey(t, "k1")
	withScope := map[string]any{"sub": "alice", "scope": "tools"}
	with := func(kv ...any) map[string]any {
		m := map[string]any{"sub": "alice", "scope": "tools"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	meta := `resource_metadata="` + metadataURL + `"`
	tests := []struct {
		name  string
		token string
		code  int
		want  []string
	}{
		{"valid", as.Mint(withScope), http.StatusOK, nil},
		{"no token", "", http.StatusUnauthorized, []string{meta, `scope="tools"`}},
		{"expired", as.Mint(with("exp", now.Add(-5*time.Minute).Unix())), http.StatusUnauthorized, []string{meta, `error="invalid_token"`, "expired"}},
		{"not yet valid", as.Mint(with("nbf", now.Add(5*time.Minute).Unix())), http.StatusUnauthorized, []string{meta, `error="invalid_token"`, "not valid yet"}},
		{"wrong audience", as.Mint(with("aud", "http://127.0.0.1:1/mcp")), http.StatusUnauthorized, []string{meta, `error="invalid_token"`, "another audience"}},
		{"wrong issuer", as.Mint(with("iss", "http://127.0.0.1:1")), http.StatusUnauthorized, []string{meta, `error="invalid_token"`, "issued by"}},
		{"alg none", as.MintNone(withScope), http.StatusUnauthorized, []string{meta, `error="invalid_token"`}},
		{"HMAC with the public key", as.MintHMACWithPublicKey(withScope), http.StatusUnauthorized, []string{meta, `error="invalid_token"`}},
		{"wrongly signed", as.MintWith(stranger, withScope), http.StatusUnauthorized, []string{meta, `error="invalid_token"`, "does not verify"}},
		{"insufficient scope", as.Mint(map[string]any{"sub": "alice", "scope": "other"}), http.StatusForbidden, []string{meta, `error="insufficient_scope"`, `scope="tools"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, h := challenge(tt.token)
			if code != tt.code {
				t.Fatalf("%d %q, want %d", code, h, tt.code)
			}
			for _, w := range tt.want {
				if !strings.Contains(h, w) {
					t.Errorf("WWW-Authenticate %q lacks %s", h, w)
				}
			}
		})
	}

	// Rotation at the authorization server is followed without a restart.
	as.Rotate(authtest.NewECKey(t, "k2"))
	if code, h := challenge(as.Mint(withScope)); code != http.StatusOK {
		t.Errorf("a token of the rotated key: %d %q", code, h)
	}

	// The operator is whoever holds the operator scope.
	for tok, want := range map[string]int{
		as.Mint(withScope): http.StatusForbidden,
		as.Mint(map[string]any{"sub": "ops", "scope": "tools wasmtools:operate"}): http.StatusOK,
	} {
		code, h, _ := operatorRequest(t, base, http.MethodGet, "/status", tok)
		if code != want {
			t.Errorf("/status: %d %q, want %d", code, h, want)
		}
		if code == http.StatusForbidden && (!strings.Contains(h, `error="insufficient_scope"`) || !strings.Contains(h, `scope="wasmtools:operate"`) || !strings.Contains(h, meta)) {
			t.Errorf("/status refusal: %q", h)
		}
	}
}
