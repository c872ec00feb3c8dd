package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
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
