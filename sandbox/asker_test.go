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
	"sync"
	"testing"

	"github.com/wasmtools/wasmtools/sandbox"
)

// recordingAsker grants what is in allow and records what it was asked.
type recordingAsker struct {
	mu    sync.Mutex
	allow map[string]bool
	asked []sandbox.GrantRequest
}

func (a *recordingAsker) AskGrant(_ context.Context, r sandbox.GrantRequest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, r)
	if a.allow[r.Target] {
		return nil
	}
	return errors.New("the person said no")
}

func TestNetworkAsk(t *testing.T) {
	var other *httptest.Server
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, other.URL+"/x", http.StatusFound)
			return
		}
		fmt.Fprint(w, "hello")
	}))
	defer srv.Close()
	other = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "other") }))
	defer other.Close()
	self := strings.TrimPrefix(srv.URL, "http://")
	otherHost := strings.TrimPrefix(other.URL, "http://")
	u, _ := url.Parse(srv.URL)

	tests := []struct {
		name      string
		ask       []string
		allow     []string
		asker     bool
		url       string
		want      string // the result, or in the trap
		wantAsked []sandbox.GrantRequest
	}{
		{"granted after asking", []string{"127.0.0.1:" + u.Port()}, []string{self}, true, srv.URL, "200 hello",
			[]sandbox.GrantRequest{{Kind: sandbox.GrantNetwork, Target: self}}},
		{"pattern ceiling", []string{"127.0.0.*:" + u.Port()}, []string{self}, true, srv.URL, "200 hello",
			[]sandbox.GrantRequest{{Kind: sandbox.GrantNetwork, Target: self}}},
		{"refused by the asker", []string{self}, nil, true, srv.URL, "request to " + self + " refused: the person said no",
			[]sandbox.GrantRequest{{Kind: sandbox.GrantNetwork, Target: self}}},
		{"outside the ceiling: nobody asked", []string{"example.com"}, []string{self}, true, srv.URL, `needs "` + self + `" in allowed_hosts`, nil},
		{"a name with a right-to-left override: nobody asked", []string{"*.example.org"}, nil, true, "http://a\u202eb.example.org/", `host "a\u202eb.example.org" has characters other than ASCII letters`, nil},
		{"no asker", []string{self}, nil, false, srv.URL, "request to " + self + " refused: no one can be asked for " + self, nil},
		{"redirect asked as such", []string{self, otherHost}, []string{self}, true, srv.URL + "/redirect", "redirect to " + otherHost + " refused: the person said no",
			[]sandbox.GrantRequest{{Kind: sandbox.GrantNetwork, Target: self}, {Kind: sandbox.GrantNetwork, Target: otherHost, Redirect: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inst := grantsInstance(t, sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: tt.ask, AllowPrivate: true}))
			a := &recordingAsker{allow: map[string]bool{}}
			for _, h := range tt.allow {
				a.allow[h] = true
			}
			ctx := context.Background()
			if tt.asker {
				ctx = sandbox.WithAsker(ctx, a)
			}
			b, _ := json.Marshal(map[string]string{"url": tt.url})
			out, err := inst.Call(ctx, "call", []byte(`{"params":{"name":"fetch","arguments":`+string(b)+`}}`), nil)
			got := string(out)
			if err != nil {
				got = err.Error()
				var ne *sandbox.NetworkError
				if !errors.As(err, &ne) || !errors.Is(err, sandbox.ErrHostNotGranted) {
					t.Errorf("error %v: not a NetworkError matching ErrHostNotGranted", err)
				}
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want it to hold %q", got, tt.want)
			}
			if fmt.Sprint(a.asked) != fmt.Sprint(tt.wantAsked) {
				t.Errorf("asked %v, want %v", a.asked, tt.wantAsked)
			}
		})
	}
}

func TestNetworkAskValidated(t *testing.T) {
	err := sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: []string{"https://example.com"}}).Validate()
	if err == nil || !strings.Contains(err.Error(), "network: ask: allowed host") {
		t.Fatalf("Validate: %v, want the ask entry refused", err)
	}
}

func TestFileAsk(t *testing.T) {
	ro, rw := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(ro, "a.txt"), []byte("hello"), 0o644)
	p := sandbox.NewPolicy().WithAskMounts(
		sandbox.Mount{HostPath: ro, GuestPath: "/ro", ReadOnly: true},
		sandbox.Mount{HostPath: rw, GuestPath: "/rw"},
	)
	file := func(dir, mode string) sandbox.GrantRequest {
		return sandbox.GrantRequest{Kind: sandbox.GrantFile, Target: dir, Mode: mode}
	}
	tests := []struct {
		name      string
		tool      string
		args      map[string]string
		allow     []string // targets+mode granted
		asker     bool
		want      string
		wantAsked []sandbox.GrantRequest
	}{
		{"read granted", "read", map[string]string{"path": "/ro/a.txt"}, []string{ro + " read"}, true, "hello", []sandbox.GrantRequest{file(ro, "read")}},
		{"read refused", "read", map[string]string{"path": "/ro/a.txt"}, nil, true, "Permission denied", []sandbox.GrantRequest{file(ro, "read")}},
		{"listing the folder asks", "list", map[string]string{"path": "/ro"}, nil, true, "Permission denied", []sandbox.GrantRequest{file(ro, "read")}},
		{"listing granted", "list", map[string]string{"path": "/ro"}, []string{ro + " read"}, true, "a.txt", []sandbox.GrantRequest{file(ro, "read")}},
		{"no asker", "read", map[string]string{"path": "/ro/a.txt"}, nil, false, "Permission denied", nil},
		{"write to a read-only ceiling: nobody asked", "write", map[string]string{"path": "/ro/b.txt", "text": "x"}, []string{ro + " read", ro + " read-write"}, true, "Read-only file system", nil},
		{"write granted", "write", map[string]string{"path": "/rw/b.txt", "text": "x"}, []string{rw + " read-write"}, true, "written", []sandbox.GrantRequest{file(rw, "read-write")}},
		{"write refused", "write", map[string]string{"path": "/rw/c.txt", "text": "x"}, []string{rw + " read"}, true, "Permission denied", []sandbox.GrantRequest{file(rw, "read-write")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inst := grantsInstance(t, p)
			a := &recordingAsker{allow: map[string]bool{}}
			for _, g := range tt.allow {
				a.allow[g] = true
			}
			ctx := context.Background()
			if tt.asker {
				ctx = sandbox.WithAsker(ctx, modeAsker{a})
			}
			b, _ := json.Marshal(tt.args)
			out, err := inst.Call(ctx, "call", []byte(`{"params":{"name":"`+tt.tool+`","arguments":`+string(b)+`}}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("got %s, want it to hold %q", out, tt.want)
			}
			if fmt.Sprint(a.asked) != fmt.Sprint(tt.wantAsked) {
				t.Errorf("asked %v, want %v", a.asked, tt.wantAsked)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(rw, "c.txt")); err == nil {
		t.Error("a refused write made its file")
	}
}

// modeAsker asks a recordingAsker with "TARGET MODE" as the key of a file
// grant.
type modeAsker struct{ a *recordingAsker }

func (m modeAsker) AskGrant(ctx context.Context, r sandbox.GrantRequest) error {
	m.a.mu.Lock()
	ok := m.a.allow[r.Target+" "+r.Mode]
	m.a.asked = append(m.a.asked, r)
	m.a.mu.Unlock()
	if ok {
		return nil
	}
	return errors.New("no")
}

// TestFileAskHeldFileNeedsTheCallsGrant: a grant of an ask mount lasts for
// its call, so a file the guest opened under one call's grant and kept
// open is of no use in a later call that was not granted the folder: the
// person who allowed "once" allowed one call, not every later one.
func TestFileAskHeldFileNeedsTheCallsGrant(t *testing.T) {
	rw := t.TempDir()
	os.WriteFile(filepath.Join(rw, "a.txt"), []byte("hello"), 0o644)
	inst := grantsInstance(t, sandbox.NewPolicy().WithAskMounts(sandbox.Mount{HostPath: rw, GuestPath: "/rw"}))
	call := func(a sandbox.Asker, tool string, args map[string]string) string {
		t.Helper()
		b, _ := json.Marshal(args)
		out, err := inst.Call(sandbox.WithAsker(context.Background(), a), "call", []byte(`{"params":{"name":"`+tool+`","arguments":`+string(b)+`}}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	once := &recordingAsker{allow: map[string]bool{rw + " read": true, rw + " read-write": true}}
	if out := call(modeAsker{once}, "hold", map[string]string{"path": "/rw/a.txt", "text": "write"}); !strings.Contains(out, "held") {
		t.Fatalf("hold with the folder granted: %s", out)
	}
	// Later calls, whose person refuses the folder.
	no := &recordingAsker{allow: map[string]bool{}}
	if out := call(modeAsker{no}, "held", map[string]string{"text": "HACKED"}); !strings.Contains(out, "denied") {
		t.Errorf("a write through the held file in a call refused the folder: %s, want it refused", out)
	}
	if b, _ := os.ReadFile(filepath.Join(rw, "a.txt")); string(b) != "hello" {
		t.Errorf("the file holds %q after a call refused the folder, want %q", b, "hello")
	}
	os.WriteFile(filepath.Join(rw, "a.txt"), []byte("secret"), 0o644)
	if out := call(modeAsker{no}, "held", nil); strings.Contains(out, "secret") {
		t.Errorf("a read through the held file in a call refused the folder: %s, want it refused", out)
	}
	want := []sandbox.GrantRequest{{Kind: sandbox.GrantFile, Target: rw, Mode: sandbox.ModeReadWrite}, {Kind: sandbox.GrantFile, Target: rw, Mode: sandbox.ModeRead}}
	if fmt.Sprint(no.asked) != fmt.Sprint(want) {
		t.Errorf("the later calls asked %v, want %v", no.asked, want)
	}
}
