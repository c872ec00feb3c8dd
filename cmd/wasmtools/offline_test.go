package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sources"
	"github.com/wasmtools/wasmtools/internal/sources/sourcestest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// registryProxy stands in front of a real registry: "pass" forwards,
// "down" drops every connection unanswered, "stall" holds every request
// until the client gives up.
type registryProxy struct {
	mode atomic.Value // string
	srv  *httptest.Server
}

func newRegistryProxy(t *testing.T, registry string) *registryProxy {
	p := &registryProxy{}
	p.mode.Store("pass")
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: registry})
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p.mode.Load().(string) {
		case "down":
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
		case "stall":
			<-r.Context().Done()
		default:
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(p.srv.CloseClientConnections)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *registryProxy) host() string { return strings.TrimPrefix(p.srv.URL, "http://") }

// serveStoppable is serveInProcess that waits only for the first load
// (not the background fetch) and can be stopped midway.
func serveStoppable(t *testing.T, args ...string) (url string, stderr *lockedBuffer, stop func()) {
	t.Helper()
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	stderr = &lockedBuffer{}
	done := make(chan struct{})
	go func() {
		run(ctx, append([]string{"serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, "--http", addr}, args...), lookup(map[string]string{"WASMTOOLS_OPERATOR_TOKEN": testOperatorToken}), strings.NewReader(""), &bytes.Buffer{}, stderr)
		close(done)
	}()
	var once atomic.Bool
	stop = func() {
		if once.CompareAndSwap(false, true) {
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("serving MCP over streamable HTTP", "plugins loaded")) {
		t.Fatalf("serve did not start:\n%s", stderr.String())
	}
	return "http://" + addr, stderr, stop
}

// TestServeOffline: a start needs no registry. Stored, verified bytes
// serve at once (a digest pin always; a tag's last verified digest, marked
// stored, until the registry answers), nothing the store holds is
// downloaded again, and a registry that is down or stalls holds neither
// the local plugins nor readiness: the slow source is bounded per stage
// and shown in /status.
func TestServeOffline(t *testing.T) {
	cosign := sourcestest.Cosign(t)
	registry, _ := sourcestest.Registry(t)
	proxy := newRegistryProxy(t, registry)
	key, pub := sourcestest.KeyPair(t, cosign, t.TempDir())
	v1 := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	push := func(repo, tag, version string) string {
		d := sourcestest.Push(t, registry, repo, tag, sources.MediaTypeWasm, bytes.Replace(v1, []byte(`"v1"`), []byte(`"`+version+`"`), 1))
		sourcestest.Sign(t, cosign, key, registry+"/"+repo+"@"+d)
		return d
	}
	push("plugins/tagged", "stable", "v1")
	pinned := push("plugins/pinned", "any", "v2")
	push("plugins/fresh", "v1", "v3")
	// The local plugin is counter: any plugin shows that local plugins
	// serve whatever the registry does, and a Go plugin's load, seconds
	// under -race, in each of the three starts, only delays every step.
	local := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	store := t.TempDir()
	dir := t.TempDir()
	// stage_timeout leaves step 3 time, on a loaded machine, to see the
	// stalled stage before the bound ends it (it was 2 s, then 10 s: under
	// -race on a loaded machine the first list came 17 s after the start,
	// and the status is read after it).
	write := func(name, extra string) string {
		cfg := filepath.Join(dir, name)
		os.WriteFile(cfg, []byte(fmt.Sprintf(`[sources]
stage_timeout = "30s"

[plugins.tagged]
source = "oci://%[1]s/plugins/tagged:stable"
prefix = "tagged-"

[plugins.pinned]
source = "oci://%[1]s/plugins/pinned@%[2]s"
prefix = "pinned-"
%[3]s`, proxy.host(), pinned, extra)), 0o644)
		return cfg
	}
	first := write("first.toml", "")
	args := func(cfg string) []string {
		return []string{"--config", cfg, "--public-key", pub, "--source-dir", store, local}
	}

	// 1. Registry up: both fetched and stored.
	url, stderr, stop := serveStoppable(t, args(first)...)
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains(`msg="plugin sources fetched"`)) {
		t.Fatalf("sources not fetched:\n%s", stderr.String())
	}
	cs, err := connectURL(t, url, bearer(""))
	if err != nil {
		t.Fatal(err)
	}
	if got := callText(t, cs, "tagged-version", nil); got != "v1" {
		t.Fatalf("tagged-version = %q\n%s", got, stderr.String())
	}
	stop()

	// 2. Registry down: the stored versions serve in the first load.
	proxy.mode.Store("down")
	url, stderr, stop = serveStoppable(t, args(first)...)
	cs, err = connectURL(t, url, bearer(""))
	if err != nil {
		t.Fatal(err)
	}
	names := toolNames(t, cs)
	for _, want := range []string{"count", "tagged-version", "pinned-version"} {
		if !slices.Contains(names, want) {
			t.Fatalf("registry down: tools %v, want %s among them\n%s", names, want, stderr.String())
		}
	}
	if got := callText(t, cs, "pinned-version", nil); got != "v2" {
		t.Errorf("pinned-version = %q", got)
	}
	if !strings.Contains(stderr.String(), `msg="plugin served from the store: its last verified version, until the source answers" plugin=tagged`) {
		t.Errorf("no warning for the tag served from the store:\n%s", stderr.String())
	}
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains(`msg="plugin sources fetched"`)) {
		t.Fatalf("background fetch did not end:\n%s", stderr.String())
	}
	st := statusOf(t, url)
	if s := st["tagged"]; s.Source == nil || !s.Source.Stored || s.Source.Error == "" || s.SHA256 == "" {
		t.Errorf("tagged with the registry down: %+v %+v; want served, stored, with the fetch error", s, s.Source)
	}
	if s := st["pinned"]; s.Source == nil || s.Source.Error != "" || s.State != "loaded" {
		t.Errorf("pinned with the registry down: %+v %+v; want served, never asked", s, s.Source)
	}
	if strings.Contains(stderr.String(), "plugin downloaded") {
		t.Errorf("downloaded with the registry down?\n%s", stderr.String())
	}
	stop()

	// 3. Registry stalls, and a source the store lacks: the local plugin
	// and the stored ones serve, /readyz answers 200 and /status shows
	// the stalled stage; the stage bound gives up; once the registry
	// answers again, a reload fetches only what the store lacks.
	proxy.mode.Store("stall")
	second := write("second.toml", fmt.Sprintf("\n[plugins.fresh]\nsource = \"oci://%s/plugins/fresh:v1\"\nprefix = \"fresh-\"\n", proxy.host()))
	start := time.Now()
	url, stderr, stop = serveStoppable(t, args(second)...)
	// Ready once the local and stored plugins are loaded (serveStoppable
	// returns when the listener is up, which may come first): 503
	// "loading" until then. That readiness did not wait for the stalled
	// registry is checked below, where fresh is still in its stage.
	for deadline := time.Now().Add(startupTimeout); ; {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		if err == nil && resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) || (err == nil && resp.StatusCode != http.StatusServiceUnavailable) {
			t.Fatalf("readyz with the registry stalled: %v %v", resp, err)
		}
		stderr.waitFor(time.Now().Add(100*time.Millisecond), contains("plugins loaded"))
	}
	cs, err = connectURL(t, url, bearer(""))
	if err != nil {
		t.Fatal(err)
	}
	names = toolNames(t, cs)
	if !slices.Contains(names, "count") || !slices.Contains(names, "tagged-version") || slices.Contains(names, "fresh-version") {
		t.Fatalf("registry stalled: tools %v, want count and tagged-version, not fresh-version", names)
	}
	t.Logf("registry stalled: first list %v after the start", time.Since(start).Round(time.Millisecond))
	if strings.Contains(stderr.String(), `msg="plugin sources fetched"`) {
		t.Fatalf("the fetch ended before the stall was seen?\n%s", stderr.String())
	}
	// The fetch begins in the background after the first load, which a
	// loaded machine may not have scheduled yet: its status is awaited.
	for deadline := time.Now().Add(startupTimeout); ; {
		s := statusOf(t, url)["fresh"]
		if s.Source != nil && s.Source.Stage == "resolve" && s.State == "loading" {
			break
		}
		if time.Now().After(deadline) || (s.Source != nil && s.Source.Stage != "" && s.Source.Stage != "resolve") {
			t.Fatalf("fresh while the registry stalls: %+v %+v; want loading, stage resolve", s, s.Source)
		}
		stderr.waitFor(time.Now().Add(100*time.Millisecond), contains(`msg="plugin sources fetched"`))
	}
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains(`msg="plugin sources fetched"`)) {
		t.Fatalf("the stage bound did not end the fetch:\n%s", stderr.String())
	}
	if s := statusOf(t, url)["fresh"]; s.Source == nil || !strings.Contains(s.Source.Error, "stage timed out") {
		t.Errorf("fresh after the stage bound: %+v %+v", s, s.Source)
	}
	proxy.mode.Store("pass")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"reload", "--url", url}, lookup(map[string]string{"WASMTOOLS_OPERATOR_TOKEN": testOperatorToken}), nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "changed: true") {
		t.Fatalf("reload once the registry answers: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if got := callText(t, cs, "fresh-version", nil); got != "v3" {
		t.Errorf("fresh-version = %q", got)
	}
	if n := strings.Count(stderr.String(), `msg="plugin downloaded"`); n != 1 || !strings.Contains(stderr.String(), `msg="plugin downloaded" plugin=fresh`) {
		t.Errorf("%d downloads, want only fresh's:\n%s", n, stderr.String())
	}
	s := statusOf(t, url)["tagged"]
	if s.Source == nil || s.Source.Stored || s.Source.Error != "" {
		t.Fatalf("tagged once the registry answered: %+v", s.Source)
	}

	// 4. A store entry changed on disk is refused and reported (log,
	// /status, the reload's result) before it is fetched again.
	blob := filepath.Join(store, "blobs", "sha256", s.Source.SHA256)
	good, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(blob, append(bytes.Clone(good), 0), 0o644)
	out.Reset()
	errb.Reset()
	code := run(context.Background(), []string{"reload", "--url", url}, lookup(map[string]string{"WASMTOOLS_OPERATOR_TOKEN": testOperatorToken}), nil, &out, &errb)
	if code != 1 || !strings.Contains(out.String(), "store entry changed") || !strings.Contains(out.String(), "changed: true") {
		t.Errorf("reload over a changed store: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(stderr.String(), `msg="plugin store entry changed on disk: refused, fetching it again" plugin=tagged`) {
		t.Errorf("no log line for the changed store:\n%s", stderr.String())
	}
	if s := statusOf(t, url)["tagged"]; s.Source == nil || !strings.Contains(s.Source.StoreChanged, "store entry changed") {
		t.Errorf("status after the changed store: %+v", s.Source)
	}
	if b, _ := os.ReadFile(blob); !bytes.Equal(b, good) {
		t.Error("the store entry was not fetched again")
	}
	if got := callText(t, cs, "tagged-version", nil); got != "v1" {
		t.Errorf("tagged-version after the repair = %q", got)
	}
}
