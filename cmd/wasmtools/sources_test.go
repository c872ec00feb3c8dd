package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/wasmtools/wasmtools/internal/sources"
	"github.com/wasmtools/wasmtools/internal/sources/sourcestest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// toolNames lists the names of the tools cs is served, in the order
// served (sorted).
func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	return names
}

// statusOf runs `wasmtools status --json` against url.
func statusOf(t *testing.T, url string) map[string]pluginStatus {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"status", "--url", url, "--json"}, lookup(map[string]string{"WASMTOOLS_OPERATOR_TOKEN": testOperatorToken}), nil, &out, &errb); code != 0 {
		t.Fatalf("status: exit %d: %s", code, errb.String())
	}
	var rep statusReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	m := map[string]pluginStatus{}
	for _, p := range rep.Plugins {
		m[p.Name] = p
	}
	return m
}

// TestServeOCI: `wasmtools serve oci://…` pulls a plugin from a real
// registry, verifies its cosign signature and serves it; /status shows the
// digest; a moved tag is refused until signed, the old version serving,
// and swapped in by `wasmtools reload` once it is.
func TestServeOCI(t *testing.T) {
	cosign := sourcestest.Cosign(t)
	host, _ := sourcestest.Registry(t)
	key, pub := sourcestest.KeyPair(t, cosign, t.TempDir())
	v1 := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	v2 := bytes.Replace(v1, []byte(`"v1"`), []byte(`"v2"`), 1)
	d1 := sourcestest.Push(t, host, "plugins/versioned", "stable", sources.MediaTypeWasm, v1)
	sourcestest.Sign(t, cosign, key, host+"/plugins/versioned@"+d1)

	env := map[string]string{"WASMTOOLS_OPERATOR_TOKEN": testOperatorToken}
	url, stderr := serveInProcess(t, env, "--public-key", pub, "--source-dir", t.TempDir(), "oci://"+host+"/plugins/versioned:stable")
	cs, err := connectURL(t, url, bearer(""))
	if err != nil {
		t.Fatal(err)
	}
	if got := callText(t, cs, "version", nil); got != "v1" {
		t.Fatalf("version = %q\n%s", got, stderr.String())
	}
	st := statusOf(t, url)["versioned"]
	if st.State != "loaded" || st.Source == nil || st.Source.Digest != d1 || !strings.Contains(st.Source.Verified, pub) {
		t.Fatalf("status = %+v %+v", st, st.Source)
	}

	// The tag moves to an unsigned version: refused, v1 serves on.
	d2 := sourcestest.Push(t, host, "plugins/versioned", "stable", sources.MediaTypeWasm, v2)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"reload", "--url", url}, lookup(env), nil, &out, &errb); code != 1 || !strings.Contains(out.String(), "signature") {
		t.Fatalf("reload of an unsigned tag: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if got := callText(t, cs, "version", nil); got != "v1" {
		t.Fatalf("after a refused move: version = %q", got)
	}
	st = statusOf(t, url)["versioned"]
	if st.State != "error" || !strings.Contains(st.Error, pub) || st.Source.Digest != d1 || st.SHA256 == "" {
		t.Fatalf("status after a refused move = %+v %+v", st, st.Source)
	}

	// Signed: reload swaps it in.
	sourcestest.Sign(t, cosign, key, host+"/plugins/versioned@"+d2)
	out.Reset()
	if code := run(context.Background(), []string{"reload", "--url", url}, lookup(env), nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "changed: true") {
		t.Fatalf("reload of a signed tag: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if got := callText(t, cs, "version", nil); got != "v2" {
		t.Fatalf("after the move: version = %q\n%s", got, stderr.String())
	}
	st = statusOf(t, url)["versioned"]
	if st.State != "loaded" || st.Source.Digest != d2 || st.Error != "" {
		t.Fatalf("status after the move = %+v %+v", st, st.Source)
	}
	if !strings.Contains(stderr.String(), "plugin downloaded") {
		t.Errorf("no progress in the log:\n%s", stderr.String())
	}
}

// TestServeOCIRefused: a plugin whose signature is by another key is not
// served, and its status names the key.
func TestServeOCIRefused(t *testing.T) {
	cosign := sourcestest.Cosign(t)
	host, _ := sourcestest.Registry(t)
	_, pub := sourcestest.KeyPair(t, cosign, t.TempDir())
	otherKey, _ := sourcestest.KeyPair(t, cosign, t.TempDir())
	d := sourcestest.Push(t, host, "plugins/versioned", "v1", sources.MediaTypeWasm, testplugins.Bytes(t, testplugins.Test(t, "versioned")))
	sourcestest.Sign(t, cosign, otherKey, host+"/plugins/versioned@"+d)
	url, _ := serveInProcess(t, nil, "--public-key", pub, "--source-dir", t.TempDir(), "oci://"+host+"/plugins/versioned:v1")
	st := statusOf(t, url)["versioned"]
	if st.State != "error" || !strings.Contains(st.Error, "none of the 1 signatures") || !strings.Contains(st.Error, pub) || st.SHA256 != "" {
		t.Fatalf("status = %+v", st)
	}
	cs, err := connectURL(t, url, bearer(""))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := cs.ListTools(context.Background(), nil); err != nil || len(res.Tools) != 0 {
		t.Fatalf("tools = %v, %v", res, err)
	}
}

// TestHyperMCPExample serves hyper-mcp's own example configurations
// (testdata/hyper-mcp), their URLs pointed at a local registry where the
// test pushed a signed plugin, as hyper-mcp publishes them (an image
// whose layer is a tarball with plugin.wasm), for each.
func TestHyperMCPExample(t *testing.T) {
	cosign := sourcestest.Cosign(t)
	host, _ := sourcestest.Registry(t)
	key, pub := sourcestest.KeyPair(t, cosign, t.TempDir())
	v1 := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	for i, repo := range []string{"tuananh/time-plugin", "tuananh/qrcode-plugin", "tuananh/hash-plugin", "tuananh/myip-plugin", "tuananh/fetch-plugin", "example/demo-plugin"} {
		// Other bytes for each (v1 for time, v2…): byte-identical modules
		// loaded at once as several plugins can panic in wazero's file
		// cache (a known issue of the sandbox, outside this test's scope).
		wasm := bytes.Replace(v1, []byte(`"v1"`), []byte(fmt.Sprintf(`"v%d"`, i+1)), 1)
		layer := sourcestest.Tarball(t, wasm)
		d := sourcestest.Push(t, host, repo, "latest", ocispec.MediaTypeImageLayerGzip, layer)
		sourcestest.Sign(t, cosign, key, host+"/"+repo+"@"+d)
	}
	for _, tt := range []struct {
		file  string
		tools []string
	}{
		{"config.example.yaml", []string{"example_plugin-version", "fetch-version", "hash-version", "myip-version", "qr-code-version", "time-version"}},
		{"config.example.json", []string{"fetch-version", "hash-version", "myip-version", "qr-code-version", "time-version"}},
	} {
		t.Run(tt.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", "hyper-mcp", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(t.TempDir(), tt.file)
			os.WriteFile(cfg, bytes.ReplaceAll(b, []byte("oci://ghcr.io/"), []byte("oci://"+host+"/")), 0o644)
			url, stderr := serveInProcess(t, nil, "--hyper-mcp-config", cfg, "--public-key", pub, "--source-dir", t.TempDir())
			cs, err := connectURL(t, url, bearer(""))
			if err != nil {
				t.Fatal(err)
			}
			if names := toolNames(t, cs); !slices.Equal(names, tt.tools) {
				t.Fatalf("tools = %v, want %v\n%s", names, tt.tools, stderr.String())
			}
			if got := callText(t, cs, "time-version", nil); got != "v1" {
				t.Errorf("time-version = %q", got)
			}
		})
	}
}

// TestHyperMCPRefused: settings that cannot be mapped are errors naming
// them, and HYPER_MCP_INSECURE_SKIP_SIGNATURE is honoured.
func TestHyperMCPRefused(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("dynamic_loading: true\nplugins:\n  p:\n    url: s3://bucket/p.wasm\n    runtime_config:\n      skip_prompts: [\"(\"]\noci:\n  cert_email: me@example.com\n"), 0o644)
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := run(ctx, []string{"serve", "--hyper-mcp-config", bad, "--source-dir", t.TempDir()}, nil, strings.NewReader(""), &out, &errb)
	for _, want := range []string{"plugins.p.url", "plugins.p.runtime_config.skip_prompts[0]", "oci.cert_email", "dynamic_loading"} {
		if code != 1 || !strings.Contains(errb.String(), want) {
			t.Errorf("exit %d, want an error naming %s:\n%s", code, want, errb.String())
		}
	}
}

// TestServeOCIRefresh: with --refresh, a tag moved to a signed version is
// swapped in without being asked.
func TestServeOCIRefresh(t *testing.T) {
	cosign := sourcestest.Cosign(t)
	host, _ := sourcestest.Registry(t)
	key, pub := sourcestest.KeyPair(t, cosign, t.TempDir())
	v1 := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	d1 := sourcestest.Push(t, host, "plugins/versioned", "stable", sources.MediaTypeWasm, v1)
	sourcestest.Sign(t, cosign, key, host+"/plugins/versioned@"+d1)
	url, stderr := serveInProcess(t, nil, "--public-key", pub, "--refresh", "100ms", "--source-dir", t.TempDir(), "versioned=oci://"+host+"/plugins/versioned:stable")
	cs, err := connectURL(t, url, bearer(""))
	if err != nil {
		t.Fatal(err)
	}
	if got := callText(t, cs, "version", nil); got != "v1" {
		t.Fatalf("version = %q", got)
	}
	v2 := bytes.Replace(v1, []byte(`"v1"`), []byte(`"v2"`), 1)
	d2 := sourcestest.Push(t, host, "plugins/versioned", "stable", sources.MediaTypeWasm, v2)
	sourcestest.Sign(t, cosign, key, host+"/plugins/versioned@"+d2)
	// The server logs the swap: "plugin source fetched" naming d2 (once
	// its signature is there: a refresh before refuses it), then "plugins
	// compiled and swapped in"; /status shows it from then on.
	swapped := func(s string) bool {
		for line := range strings.Lines(s) {
			if strings.Contains(line, `msg="plugin source fetched"`) && strings.Contains(line, "digest="+d2) {
				_, after, _ := strings.Cut(s, line)
				return strings.Contains(after, `msg="plugins compiled and swapped in"`)
			}
		}
		return false
	}
	if !stderr.waitFor(time.Now().Add(startupTimeout), swapped) {
		t.Fatalf("the moved tag was not picked up:\n%s", stderr.String())
	}
	sum := sha256.Sum256(v2)
	if st := statusOf(t, url)["versioned"]; st.SHA256 != hex.EncodeToString(sum[:]) || st.Source == nil || st.Source.Digest != d2 {
		t.Fatalf("swapped in, but /status shows %+v, want sha256 %x, digest %s:\n%s", st, sum, d2, stderr.String())
	}
	if got := callText(t, cs, "version", nil); got != "v2" {
		t.Fatalf("after the refresh: version = %q", got)
	}
}

// heldRegistry is an OCI registry on loopback serving one plugin, x/p:v1,
// whose blobs, if hold is set, it sends the headers and first byte of and
// then holds back until hold is closed or the client leaves: a registry
// that stalls mid-download. held is closed when it first holds one.
type heldRegistry struct {
	man   []byte
	blobs map[digest.Digest][]byte
	hold  chan struct{}
	held  chan struct{}
	once  sync.Once
}

func newHeldRegistry(t *testing.T, wasm []byte, hold bool) string {
	t.Helper()
	config := []byte("{}")
	man, err := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: ocispec.Descriptor{MediaType: ocispec.MediaTypeEmptyJSON, Digest: digest.FromBytes(config), Size: int64(len(config))},
		Layers: []ocispec.Descriptor{{MediaType: sources.MediaTypeWasm, Digest: digest.FromBytes(wasm), Size: int64(len(wasm))}}})
	if err != nil {
		t.Fatal(err)
	}
	g := &heldRegistry{man: man, blobs: map[digest.Digest][]byte{digest.FromBytes(config): config, digest.FromBytes(wasm): wasm}, held: make(chan struct{})}
	if hold {
		g.hold = make(chan struct{})
	}
	srv := httptest.NewServer(g)
	// Cleanups run last-in first-out: the hold ends before the server
	// closes, which waits for its handlers.
	t.Cleanup(srv.Close)
	if hold {
		t.Cleanup(g.release)
	}
	heldRegistries.Store(strings.TrimPrefix(srv.URL, "http://"), g)
	return strings.TrimPrefix(srv.URL, "http://")
}

// heldRegistries finds a heldRegistry by its host, for the test to wait
// on and release.
var heldRegistries sync.Map

func (g *heldRegistry) release() {
	select {
	case <-g.hold:
	default:
		close(g.hold)
	}
}

func (g *heldRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serve := func(mediaType string, b []byte) {
		w.Header().Set("Content-Type", mediaType)
		w.Header().Set("Docker-Content-Digest", digest.FromBytes(b).String())
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		if r.Method == http.MethodHead {
			return
		}
		if g.hold != nil && strings.Contains(r.URL.Path, "/blobs/") {
			w.Write(b[:1])
			w.(http.Flusher).Flush()
			g.once.Do(func() { close(g.held) })
			select {
			case <-g.hold:
			case <-r.Context().Done():
				return
			}
			b = b[1:]
		}
		w.Write(b)
	}
	_, ref, _ := strings.Cut(r.URL.Path, "/manifests/")
	_, blob, _ := strings.Cut(r.URL.Path, "/blobs/")
	switch {
	case r.URL.Path == "/v2/":
	case ref == "v1" || ref == digest.FromBytes(g.man).String():
		serve(ocispec.MediaTypeImageManifest, g.man)
	case blob != "" && g.blobs[digest.Digest(blob)] != nil:
		serve("application/octet-stream", g.blobs[digest.Digest(blob)])
	default:
		http.NotFound(w, r)
	}
}

// TestServeNoWatchSlowSourceHoldsNoOther: with --no-watch, a source
// whose registry stalls mid-download does not hold up the others: one
// fetched is compiled and served while the slow one is still held (each
// source's download ends on its own timeout). Before, the sources' swap
// came after the whole fetch, when the slowest source ended.
func TestServeNoWatchSlowSourceHoldsNoOther(t *testing.T) {
	fast := newHeldRegistry(t, testplugins.Bytes(t, testplugins.Test(t, "versioned")), false)
	slow := newHeldRegistry(t, testplugins.Bytes(t, testplugins.Test(t, "compute")), true)
	g, _ := heldRegistries.Load(slow)
	held := g.(*heldRegistry)

	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &lockedBuffer{}
	done := make(chan struct{})
	go func() {
		run(ctx, []string{"serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, "--http", addr, "--no-watch",
			"--insecure-skip-signature", "--source-dir", t.TempDir(), "fast=oci://" + fast + "/x/p:v1", "slow=oci://" + slow + "/x/p:v1"},
			lookup(nil), strings.NewReader(""), &bytes.Buffer{}, stderr)
		close(done)
	}()
	t.Cleanup(func() { held.release(); cancel(); <-done })
	url := "http://" + addr

	select {
	case <-held.held:
	case <-time.After(startupTimeout):
		t.Fatalf("the slow registry was never asked for its blob:\n%s", stderr.String())
	}
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains(`msg="plugins compiled and swapped in"`)) {
		t.Fatalf("the fast source was not swapped in while the slow one was held:\n%s", stderr.String())
	}
	select {
	case <-held.hold:
		t.Fatal("released")
	default:
	}
	if st := statusOf(t, url)["fast"]; st.State != "loaded" {
		t.Fatalf("fast = %+v while the slow source is held:\n%s", st, stderr.String())
	}
	if strings.Contains(stderr.String(), `msg="plugin sources fetched"`) {
		t.Fatalf("the slow source's fetch ended:\n%s", stderr.String())
	}
	held.release()
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains(`msg="plugin sources fetched"`)) {
		t.Fatalf("the sources' fetch did not end once released:\n%s", stderr.String())
	}
	if st := statusOf(t, url)["slow"]; st.State != "loaded" {
		t.Errorf("slow = %+v once released:\n%s", st, stderr.String())
	}
}
