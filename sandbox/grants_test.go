package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// callGrants calls a tool of the grants test plugin with JSON arguments.
func callGrants(t *testing.T, inst *sandbox.Instance, tool string, args map[string]string) (string, error) {
	t.Helper()
	b, _ := json.Marshal(args)
	return callServlet(t, inst, tool, string(b))
}

func grantsInstance(t *testing.T, p sandbox.Policy) *sandbox.Instance {
	return instantiate(t, compile(t, newRuntime(t), testplugins.Test(t, "grants"), p))
}

func TestNetworkGrants(t *testing.T) {
	big := strings.Repeat("x", 2<<20)
	var other *httptest.Server
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			fmt.Fprint(w, big)
		case "/redirect":
			// Another host name for the same machine: a different grant.
			ou, _ := url.Parse(other.URL)
			http.Redirect(w, r, "http://localhost:"+ou.Port()+"/hello", http.StatusFound)
		default:
			fmt.Fprint(w, "hello from the host")
		}
	}))
	defer srv.Close()
	other = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "other") }))
	defer other.Close()
	u, _ := url.Parse(srv.URL)
	port := u.Port()
	localhost := "http://localhost:" + port

	tests := []struct {
		name   string
		net    *sandbox.Network
		url    string
		want   string // in the result
		refuse string // in the trap
	}{
		{"no grant", nil, srv.URL, "", "network access is not granted to this plugin"},
		{"host not granted", &sandbox.Network{AllowedHosts: []string{"example.com"}}, srv.URL, "", `host "127.0.0.1" is not granted to this plugin (allowed: example.com)`},
		{"loopback refused at dial", &sandbox.Network{AllowedHosts: []string{"127.0.0.1"}}, srv.URL, "", "127.0.0.1 is a loopback, private, link-local or metadata address"},
		{"a name resolving to 127.0.0.1", &sandbox.Network{AllowedHosts: []string{"localhost"}}, localhost, "", "is a loopback, private, link-local or metadata address"},
		{"metadata address", &sandbox.Network{AllowedHosts: []string{"169.254.169.254"}}, "http://169.254.169.254/latest/meta-data", "", "169.254.169.254 is a loopback"},
		{"private allowed", &sandbox.Network{AllowedHosts: []string{"127.0.0.1"}, AllowPrivate: true}, srv.URL, "200 hello from the host", ""},
		{"pattern", &sandbox.Network{AllowedHosts: []string{"127.0.0.*"}, AllowPrivate: true}, srv.URL, "200 hello", ""},
		{"redirect to a denied host", &sandbox.Network{AllowedHosts: []string{"127.0.0.1"}, AllowPrivate: true}, srv.URL + "/redirect", "", "not granted"},
		{"redirect to a granted host", &sandbox.Network{AllowedHosts: []string{"127.0.0.1", "localhost"}, AllowPrivate: true}, srv.URL + "/redirect", "200 other", ""},
		{"response over the cap", &sandbox.Network{AllowedHosts: []string{"127.0.0.1"}, AllowPrivate: true, MaxResponse: 1 << 20}, srv.URL + "/big", "", "over the 1048576-byte limit"},
		{"not http", &sandbox.Network{AllowedHosts: []string{"*"}}, "file:///etc/passwd", "", `scheme "file" is not allowed`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := sandbox.NewPolicy()
			if tt.net != nil {
				p = p.WithNetwork(*tt.net)
			}
			got, err := callGrants(t, grantsInstance(t, p), "fetch", map[string]string{"url": tt.url})
			if tt.refuse != "" {
				var he *sandbox.HostCallError
				if !errors.As(err, &he) || !strings.Contains(he.Reason, tt.refuse) {
					t.Fatalf("got %q, %v; want refused with %q", got, err, tt.refuse)
				}
				return
			}
			if err != nil || !strings.HasPrefix(got, tt.want) {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestFileGrants(t *testing.T) {
	data := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("secret"), 0o600)
	os.WriteFile(filepath.Join(data, "in.txt"), []byte("inside"), 0o644)
	os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(data, "link-out"))
	os.Symlink("in.txt", filepath.Join(data, "link-in")) // relative, inside
	os.Symlink(outside, filepath.Join(data, "dir-out"))

	rw := grantsInstance(t, sandbox.NewPolicy().WithMounts(sandbox.Mount{HostPath: data, GuestPath: "/data"}))
	ro := grantsInstance(t, sandbox.NewPolicy().WithMounts(sandbox.Mount{HostPath: data, GuestPath: "/data", ReadOnly: true}))
	none := grantsInstance(t, sandbox.NewPolicy())

	tests := []struct {
		name string
		inst *sandbox.Instance
		tool string
		args map[string]string
		want string
	}{
		{"read inside", rw, "read", map[string]string{"path": "/data/in.txt"}, "inside"},
		{"write inside", rw, "write", map[string]string{"path": "/data/new.txt", "text": "hi"}, "written"},
		{"read back", rw, "read", map[string]string{"path": "/data/new.txt"}, "hi"},
		{"dot-dot escape", rw, "read", map[string]string{"path": "/data/../" + filepath.Base(outside) + "/secret.txt"}, "error:"},
		{"deep dot-dot escape", rw, "read", map[string]string{"path": "/data/x/../../../../../../etc/passwd"}, "error:"},
		{"absolute path outside", rw, "read", map[string]string{"path": "/etc/passwd"}, "error:"},
		{"symlink out", rw, "read", map[string]string{"path": "/data/link-out"}, "error:"},
		{"symlinked folder out", rw, "read", map[string]string{"path": "/data/dir-out/secret.txt"}, "error:"},
		{"symlink in", rw, "read", map[string]string{"path": "/data/link-in"}, "inside"},
		{"make a symlink", rw, "symlink", map[string]string{"path": "/data/mine", "target": "/etc/passwd"}, "error:"},
		{"write to a symlink out", rw, "write", map[string]string{"path": "/data/link-out", "text": "pwned"}, "error:"},
		{"read-only read", ro, "read", map[string]string{"path": "/data/in.txt"}, "inside"},
		{"read-only write", ro, "write", map[string]string{"path": "/data/x.txt", "text": "no"}, "error:"},
		{"no mount", none, "read", map[string]string{"path": "/data/in.txt"}, "error:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := callGrants(t, tt.inst, tt.tool, tt.args)
			if err != nil || !strings.HasPrefix(got, tt.want) {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(b) != "secret" {
		t.Errorf("the file outside was changed: %q", b)
	}
}

func TestEnvGrant(t *testing.T) {
	t.Setenv("WASMTOOLS_TEST_SECRET", "host-only")
	inst := grantsInstance(t, sandbox.NewPolicy().WithEnv(map[string]string{"GREETING": "hi"}))
	for name, want := range map[string]string{"GREETING": "[hi]", "WASMTOOLS_TEST_SECRET": "[]", "HOME": "[]", "PATH": "[]"} {
		if got, err := callGrants(t, inst, "env", map[string]string{"name": name}); err != nil || got != want {
			t.Errorf("env %s = %q, %v; want %q", name, got, err, want)
		}
	}
	_ = context.Background
}
