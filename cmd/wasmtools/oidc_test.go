package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/oauth2"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/sources/sourcestest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// zitadelInstall is how scripts/deps.sh installs zitadel/oidc's example
// OpenID provider.
const zitadelInstall = "GOBIN=$(mktemp -d) go install github.com/zitadel/oidc/v3/example/server@v3.52.0, then move its server to $(go env GOPATH)/bin/zitadel-oidc-example"

// startOpenIDProvider runs zitadel/oidc's example OpenID provider as its
// own process on a free loopback port and returns its issuer,
// http://localhost:PORT/ (the provider names itself so). Its clients:
// "web" (secret "secret"; authorization code, token exchange); its
// users: test-user@localhost / verysecure, an administrator.
func startOpenIDProvider(t *testing.T) (issuer, redirect string) {
	t.Helper()
	bin := sourcestest.Tool(t, "zitadel-oidc-example", zitadelInstall, filepath.Join(goBin(), "zitadel-oidc-example"))
	_, port, _ := net.SplitHostPort(proxytest.FreeAddr(t))
	issuer = "http://localhost:" + port + "/"
	redirect = "http://127.0.0.1:1/callback" // never followed: the code is read off it
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "PORT="+port, "REDIRECT_URI="+redirect)
	proxytest.Start(t, cmd, func() error {
		res, err := http.Get(issuer + ".well-known/openid-configuration")
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return errors.New(res.Status)
		}
		return nil
	})
	return issuer, redirect
}

// goBin is $(go env GOPATH)/bin.
func goBin() string {
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		return ""
	}
	return filepath.Join(strings.TrimSpace(string(out)), "bin")
}

// loginCode signs the administrator in through the provider's login form
// (the authorization code flow of golang.org/x/oauth2's config) and
// returns the code the provider redirects with.
func loginCode(t *testing.T, cfg *oauth2.Config, redirect string) string {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	var code string
	client := &http.Client{Jar: jar, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(req.URL.String(), redirect) {
			code = req.URL.Query().Get("code")
			return http.ErrUseLastResponse
		}
		return nil
	}}
	res, err := client.Get(cfg.AuthCodeURL("state-1"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	id := res.Request.URL.Query().Get("authRequestID")
	if id == "" {
		t.Fatalf("no login form: %s", res.Request.URL)
	}
	login := strings.TrimSuffix(cfg.Endpoint.AuthURL, "/auth") + "/login/username"
	res, err = client.PostForm(login, url.Values{"username": {"test-user@localhost"}, "password": {"verysecure"}, "id": {id}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if code == "" {
		t.Fatalf("no code after the login: %s", res.Status)
	}
	return code
}

// TestOAuthOpenIDProvider: a real OpenID provider (zitadel/oidc's
// example, its own process on loopback) issues the tokens. wasmtools
// discovers its keys by OpenID discovery; a person signs in (the
// authorization code flow of golang.org/x/oauth2), the client exchanges
// the provider's access token (RFC 8693) for a JWT whose audience is
// wasmtools' resource, and a go-sdk client lists and calls tools with it.
// The provider's own opaque access token, introspected (RFC 7662), is for
// the provider's client, not this resource: refused.
func TestOAuthOpenIDProvider(t *testing.T) {
	issuer, redirect := startOpenIDProvider(t)
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	addr := freeAddr(t)
	resource := "http://" + addr + "/mcp"
	cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
[http.oauth]
issuer = %q
resource = %q
introspection_url = %q
client_id = "web"
client_secret = "secret"
`, issuer, resource, issuer+"oauth/introspect")), 0o644)
	serveInProcess(t, nil, "--no-watch", "--config", cfgPath, "--http", addr, dir)

	oc := &oauth2.Config{ClientID: "web", ClientSecret: "secret", RedirectURL: redirect, Scopes: []string{"openid"},
		Endpoint: oauth2.Endpoint{AuthURL: issuer + "auth", TokenURL: issuer + "oauth/token", AuthStyle: oauth2.AuthStyleInHeader}}
	ctx := context.Background()
	tok, err := oc.Exchange(ctx, loginCode(t, oc, redirect))
	if err != nil {
		t.Fatal(err)
	}
	// RFC 8693: the provider's access token for a JWT for this resource.
	req, _ := http.NewRequest(http.MethodPost, issuer+"oauth/token", strings.NewReader(url.Values{
		"grant_type":           {"urn:ietf:params:oauth:grant-type:token-exchange"},
		"subject_token":        {tok.AccessToken},
		"subject_token_type":   {"urn:ietf:params:oauth:token-type:access_token"},
		"requested_token_type": {"urn:ietf:params:oauth:token-type:id_token"},
		"audience":             {resource},
		"scope":                {"openid"},
	}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("web", "secret")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var exchanged struct {
		AccessToken string `json:"access_token"`
	}
	json.NewDecoder(res.Body).Decode(&exchanged)
	res.Body.Close()
	if strings.Count(exchanged.AccessToken, ".") != 2 {
		t.Fatalf("token exchange: %s, no JWT", res.Status)
	}

	httpClient := oauth2.NewClient(ctx, oauth2.StaticTokenSource(&oauth2.Token{AccessToken: exchanged.AccessToken, TokenType: "Bearer"}))
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: resource, HTTPClient: httpClient}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if tools, err := cs.ListTools(ctx, nil); err != nil || len(tools.Tools) == 0 {
		t.Fatalf("list: %v", err)
	}
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "count"}); err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}

	// The provider's opaque access token is its client's, not ours.
	code, challenge, body := operatorRequest(t, "http://"+addr, http.MethodGet, "/mcp", tok.AccessToken)
	if code != http.StatusUnauthorized || !strings.Contains(challenge, `error="invalid_token"`) || !strings.Contains(challenge, `resource_metadata="http://`+addr+`/.well-known/oauth-protected-resource/mcp"`) {
		t.Errorf("the provider's own access token: %d %q %s; want 401 invalid_token", code, challenge, body)
	}
}
