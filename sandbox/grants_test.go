package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

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
		ou, _ := url.Parse(other.URL)
		switch r.URL.Path {
		case "/big":
			fmt.Fprint(w, big)
		case "/redirect":
			// Another host name for the same machine: a different grant.
			http.Redirect(w, r, "http://localhost:"+ou.Port()+"/hello", http.StatusFound)
		case "/redirect-port":
			// The same host, another port (issue 12).
			http.Redirect(w, r, "http://127.0.0.1:"+ou.Port()+"/hello", http.StatusFound)
		default:
			fmt.Fprint(w, "hello from the host")
		}
	}))
	defer srv.Close()
	other = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "other") }))
	defer other.Close()
	u, _ := url.Parse(srv.URL)
	port := u.Port()
	ou, _ := url.Parse(other.URL)
	otherPort := ou.Port()
	localhost := "http://localhost:" + port
	self := "127.0.0.1:" + port

	tests := []struct {
		name   string
		net    *sandbox.Network
		url    string
		want   string // in the result
		refuse string // in the trap
		is     error  // what the trap matches
	}{
		{"no grant", nil, srv.URL, "", `network access is not granted to this plugin: the request to ` + self + ` needs "` + self + `" in allowed_hosts and allow_private_networks = true`, sandbox.ErrHostNotGranted},
		{"host not granted", &sandbox.Network{AllowedHosts: []string{"example.com"}}, srv.URL, "", `host ` + self + ` is not granted to this plugin; it needs "` + self + `" in allowed_hosts and allow_private_networks = true (it is a loopback or private address) (granted: example.com)`, sandbox.ErrHostNotGranted},
		{"port not granted", &sandbox.Network{AllowedHosts: []string{"127.0.0.1"}, AllowPrivate: true}, srv.URL, "", `needs "` + self + `"`, sandbox.ErrHostNotGranted},
		{"another port granted", &sandbox.Network{AllowedHosts: []string{"127.0.0.1:" + otherPort}, AllowPrivate: true}, srv.URL, "", `needs "` + self + `"`, sandbox.ErrHostNotGranted},
		{"loopback refused at dial", &sandbox.Network{AllowedHosts: []string{self}}, srv.URL, "", "127.0.0.1 is a loopback, private, link-local or metadata address, which needs allow_private_networks", sandbox.ErrAddressRefused},
		{"a name resolving to 127.0.0.1", &sandbox.Network{AllowedHosts: []string{"localhost:" + port}}, localhost, "", "request to localhost:" + port + " refused: 127.0.0.1 is a loopback", sandbox.ErrAddressRefused},
		{"metadata address", &sandbox.Network{AllowedHosts: []string{"169.254.169.254"}}, "http://169.254.169.254/latest/meta-data", "", "169.254.169.254 is a loopback", sandbox.ErrAddressRefused},
		{"private allowed", &sandbox.Network{AllowedHosts: []string{self}, AllowPrivate: true}, srv.URL, "200 hello from the host", "", nil},
		{"pattern", &sandbox.Network{AllowedHosts: []string{"127.0.0.*:" + port}, AllowPrivate: true}, srv.URL, "200 hello", "", nil},
		{"pattern without the port", &sandbox.Network{AllowedHosts: []string{"127.0.0.*"}, AllowPrivate: true}, srv.URL, "", `needs "` + self + `"`, sandbox.ErrHostNotGranted},
		{"redirect to a denied host", &sandbox.Network{AllowedHosts: []string{self}, AllowPrivate: true}, srv.URL + "/redirect", "", `redirect to localhost:` + otherPort + ` refused: host localhost:` + otherPort + ` is not granted`, sandbox.ErrHostNotGranted},
		{"redirect to a granted host", &sandbox.Network{AllowedHosts: []string{self, "localhost:" + otherPort}, AllowPrivate: true}, srv.URL + "/redirect", "200 other", "", nil},
		{"redirect to another port", &sandbox.Network{AllowedHosts: []string{self}, AllowPrivate: true}, srv.URL + "/redirect-port", "", `redirect to 127.0.0.1:` + otherPort + ` refused: host 127.0.0.1:` + otherPort + ` is not granted to this plugin; it needs "127.0.0.1:` + otherPort + `" in allowed_hosts`, sandbox.ErrHostNotGranted},
		{"redirect to another port, pattern", &sandbox.Network{AllowedHosts: []string{"127.0.0.*:" + port}, AllowPrivate: true}, srv.URL + "/redirect-port", "", `needs "127.0.0.1:` + otherPort + `"`, sandbox.ErrHostNotGranted},
		{"redirect to a granted port", &sandbox.Network{AllowedHosts: []string{self, "127.0.0.1:" + otherPort}, AllowPrivate: true}, srv.URL + "/redirect-port", "200 other", "", nil},
		{"response over the cap", &sandbox.Network{AllowedHosts: []string{self}, AllowPrivate: true, MaxResponse: 1 << 20}, srv.URL + "/big", "", "over the 1048576-byte limit", nil},
		{"not http", &sandbox.Network{AllowedHosts: []string{"*"}}, "file:///etc/passwd", "", `scheme "file" is not allowed`, nil},
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
				if tt.is != nil {
					var ne *sandbox.NetworkError
					if !errors.Is(err, tt.is) || !errors.As(err, &ne) || ne.Missing == "" {
						t.Errorf("the error %v does not match %v, or is no *NetworkError naming what is missing", err, tt.is)
					}
				}
				return
			}
			if err != nil || !strings.HasPrefix(got, tt.want) {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestNetworkGrantsIPv6 grants an IPv6 literal with a port.
func TestNetworkGrantsIPv6(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "six") })}}
	srv.Start()
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, tt := range []struct {
		grant, want string
	}{
		{fmt.Sprintf("[::1]:%d", port), "200 six"},
		{"[::1]", fmt.Sprintf(`needs "[::1]:%d"`, port)},
		{"::1", fmt.Sprintf(`needs "[::1]:%d"`, port)},
		{fmt.Sprintf("[::1]:%d", port+1), fmt.Sprintf(`needs "[::1]:%d"`, port)},
	} {
		t.Run(tt.grant, func(t *testing.T) {
			p := sandbox.NewPolicy().WithNetwork(sandbox.Network{AllowedHosts: []string{tt.grant}, AllowPrivate: true})
			got, err := callGrants(t, grantsInstance(t, p), "fetch", map[string]string{"url": srv.URL})
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("got %q; want %q", got, tt.want)
			}
		})
	}
}

func TestNetworkAllows(t *testing.T) {
	n := &sandbox.Network{AllowedHosts: []string{"api.example.com", "*.example.org", "*.example.net:8443", "[::1]:8080", "10.0.0.1", "fe80::1"}}
	tests := []struct {
		hostport string
		want     bool
	}{
		{"api.example.com", true},
		{"API.Example.com.", true},
		{"api.example.com:443", true},
		{"api.example.com:80", true},
		{"api.example.com:8080", false},
		{"example.com", false},
		{"a.example.org", true},
		{"a.b.example.org:443", true},
		{"example.org", false},
		{"a.example.org:8443", false},
		{"a.example.net:8443", true},
		{"a.example.net", false},
		{"[::1]:8080", true},
		{"[::1]:8081", false},
		{"[::1]", false},
		{"10.0.0.1:80", true},
		{"10.0.0.1:22", false},
		{"[fe80::1]:443", true},
		{"[fe80::1]:22", false},
		{"*.example.org", false},
	}
	for _, tt := range tests {
		if got := n.Allows(tt.hostport); got != tt.want {
			t.Errorf("Allows(%q) = %v, want %v", tt.hostport, got, tt.want)
		}
	}
	for _, bad := range []string{"", "http://example.com", "example.com:", "example.com:0", "example.com:65536", "example.com:http", "[::1", "[::1]8080", "a/b"} {
		if sandbox.CheckHostGrant(bad) == nil {
			t.Errorf("CheckHostGrant(%q) = nil, want an error", bad)
		}
	}
	for _, good := range []string{"example.com", "*.example.org:8443", "[::1]:8080", "::1", "127.0.0.1:18409"} {
		if err := sandbox.CheckHostGrant(good); err != nil {
			t.Errorf("CheckHostGrant(%q) = %v", good, err)
		}
	}
	rt := newRuntime(t)
	_, err := rt.Compile(context.Background(), testplugins.Bytes(t, testplugins.Test(t, "grants")), sandbox.NewPolicy().WithNetwork(sandbox.Network{AllowedHosts: []string{"example.com:http"}}))
	if err == nil || !strings.Contains(err.Error(), `allowed host "example.com:http"`) {
		t.Errorf("compiling with a bad grant: %v", err)
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
		{"mkdir inside", rw, "mkdir", map[string]string{"path": "/data/made"}, "made"},
		{"rename inside", rw, "rename", map[string]string{"path": "/data/new.txt", "target": "/data/made/moved.txt"}, "renamed"},
		{"read the renamed", rw, "read", map[string]string{"path": "/data/made/moved.txt"}, "hi"},
		{"list", rw, "list", map[string]string{"path": "/data/made"}, "moved.txt"},
		{"rename out through a symlinked folder", rw, "rename", map[string]string{"path": "/data/made/moved.txt", "target": "/data/dir-out/stolen.txt"}, "error:"},
		{"rename out by dot-dot", rw, "rename", map[string]string{"path": "/data/made/moved.txt", "target": "/data/../stolen.txt"}, "error:"},
		{"mkdir through a symlinked folder", rw, "mkdir", map[string]string{"path": "/data/dir-out/made"}, "error:"},
		{"list through a symlinked folder", rw, "list", map[string]string{"path": "/data/dir-out"}, "error:"},
		{"remove through a symlinked folder", rw, "remove", map[string]string{"path": "/data/dir-out/secret.txt"}, "error:"},
		{"remove inside", rw, "remove", map[string]string{"path": "/data/made/moved.txt"}, "removed"},
		{"read-only read", ro, "read", map[string]string{"path": "/data/in.txt"}, "inside"},
		{"read-only rename", ro, "rename", map[string]string{"path": "/data/in.txt", "target": "/data/x.txt"}, "error:"},
		{"read-only mkdir", ro, "mkdir", map[string]string{"path": "/data/d"}, "error:"},
		{"read-only remove", ro, "remove", map[string]string{"path": "/data/in.txt"}, "error:"},
		{"read-only list", ro, "list", map[string]string{"path": "/data"}, "dir-out,in.txt,link-in,link-out,made"},
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
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Errorf("the folder outside has %d entries, want only secret.txt", len(entries))
	}
}

// TestFileGrantsRace swaps a folder of a read-write mount with a symbolic
// link to a folder outside, over and over, while the guest reads, creates,
// writes and renames through it (issue 12: the path was checked with an
// os.Root and then opened through the host path, so a swap in between
// escaped). Nothing outside may ever be read or written.
func TestFileGrantsRace(t *testing.T) {
	data, outside := t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret.txt")
	os.WriteFile(secret, []byte("secret"), 0o600)
	// A name only the folder outside has: a listing that shows it escaped.
	os.WriteFile(filepath.Join(outside, "only-outside.txt"), []byte("x"), 0o600)
	sub, real := filepath.Join(data, "sub"), filepath.Join(data, "real")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	inst := grantsInstance(t, sandbox.NewPolicy().WithMounts(sandbox.Mount{HostPath: data, GuestPath: "/data"}))

	stop := make(chan struct{})
	swapped := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			// sub is the real folder: make it the link out, then back.
			if os.Rename(sub, real) == nil {
				os.Symlink(outside, sub)
				os.Remove(sub)
				os.Rename(real, sub)
			}
			if n == 100 {
				swapped <- struct{}{}
			}
		}
	}()
	<-swapped // the swapping is under way

	const rounds = 300
	var reads, errs int
	for i := range rounds {
		calls := []struct {
			tool string
			args map[string]string
		}{
			{"read", map[string]string{"path": "/data/sub/secret.txt"}},
			{"write", map[string]string{"path": "/data/sub/secret.txt", "text": "pwned"}},
			{"write", map[string]string{"path": fmt.Sprintf("/data/sub/new-%d.txt", i), "text": "pwned"}},
			{"rename", map[string]string{"path": "/data/sub/secret.txt", "target": fmt.Sprintf("/data/sub/moved-%d.txt", i)}},
			{"rename", map[string]string{"path": fmt.Sprintf("/data/sub/new-%d.txt", i), "target": "/data/sub/secret.txt"}},
			{"mkdir", map[string]string{"path": fmt.Sprintf("/data/sub/dir-%d", i)}},
			{"list", map[string]string{"path": "/data/sub"}},
		}
		for _, c := range calls {
			got, err := callGrants(t, inst, c.tool, c.args)
			if err != nil {
				t.Fatalf("%s %v: %v", c.tool, c.args, err)
			}
			switch {
			case strings.HasPrefix(got, "error:"):
				errs++
			case c.tool == "read":
				reads++
				if got != "pwned" {
					t.Fatalf("round %d: read %q through the mount", i, got)
				}
			case c.tool == "list" && strings.Contains(got, "only-outside.txt"):
				t.Fatalf("round %d: listed the folder outside: %s", i, got)
			}
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d rounds: %d reads served, %d calls refused or failed", rounds, reads, errs)

	entries, _ := os.ReadDir(outside)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if b, _ := os.ReadFile(secret); string(b) != "secret" || len(names) != 2 {
		t.Errorf("outside was changed: secret.txt is %q; entries %v", b, names)
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

// TestNetworkConnectionsDoNotLeak makes requests from many instances of
// one plugin that then trap or are closed (issue 12: each discarded
// instance kept its keep-alive connection and two goroutines). The
// instances share their plugin's connection pool, bounded and closed with
// the plugin.
func TestNetworkConnectionsDoNotLeak(t *testing.T) {
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	opened := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hi") }))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch s {
		case http.StateNew:
			open[c] = true
			opened++
		case http.StateClosed, http.StateHijacked:
			delete(open, c)
		}
	}
	srv.Start()
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	openConns := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return len(open), opened
	}

	rt := newRuntime(t)
	p := sandbox.NewPolicy().WithNetwork(sandbox.Network{AllowedHosts: []string{u.Host}, AllowPrivate: true})
	c, err := rt.Compile(context.Background(), testplugins.Bytes(t, testplugins.Test(t, "grants")), p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	// One instance first, so the runtime's own goroutines are in the baseline.
	warm, err := c.Instantiate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	warm.Close(context.Background())
	runtime.GC()
	baseline := runtime.NumGoroutine()

	const n = 60
	for i := range n {
		inst, err := c.Instantiate(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got, err := callGrants(t, inst, "fetch", map[string]string{"url": srv.URL}); err != nil || got != "200 hi" {
			t.Fatalf("instance %d: %q, %v", i, got, err)
		}
		if i%2 == 0 {
			// Trap: a host that is not granted.
			if _, err := callGrants(t, inst, "fetch", map[string]string{"url": "http://example.com/"}); !errors.Is(err, sandbox.ErrHostNotGranted) {
				t.Fatalf("instance %d: want a trap matching ErrHostNotGranted, got %v", i, err)
			}
			if inst.Err() == nil {
				t.Fatalf("instance %d is still open after a trap", i)
			}
		} else {
			inst.Close(context.Background())
		}
	}
	live, total := openConns()
	t.Logf("%d instances made %d connections; %d open", n, total, live)
	if live > 2 {
		t.Errorf("%d connections open after %d discarded instances; want at most the idle pool's 2 per host", live, n)
	}

	c.Close(context.Background())
	eventually(t, "the server sees every connection closed", func() bool { live, _ := openConns(); return live == 0 })
	eventually(t, "goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= baseline })
}

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
