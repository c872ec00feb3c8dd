package sources_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/wasmtools/wasmtools/internal/sources"
)

// hostileRegistry is a registry on loopback that serves one manifest
// whose single layer is described by layer, and answers blob requests
// with blob.
type hostileRegistry struct {
	manifest     []byte // served for the tag; nil: built from layer
	manifestSize int64  // the Content-Length claimed for it; 0: its size
	layer        ocispec.Descriptor
	blob         http.HandlerFunc
}

func (h *hostileRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/v2/":
		w.WriteHeader(http.StatusOK)
	case strings.Contains(r.URL.Path, "/manifests/"):
		b := h.manifest
		if b == nil {
			b, _ = json.Marshal(ocispec.Manifest{
				Versioned: specsVersioned(), MediaType: ocispec.MediaTypeImageManifest,
				Config: ocispec.DescriptorEmptyJSON, Layers: []ocispec.Descriptor{h.layer},
			})
		}
		size := h.manifestSize
		if size == 0 {
			size = int64(len(b))
		}
		w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
		w.Header().Set("Docker-Content-Digest", digest.FromBytes(b).String())
		w.Header().Set("Content-Length", fmt.Sprint(size))
		if r.Method == http.MethodHead {
			return
		}
		w.Write(b)
		if size > int64(len(b)) { // a manifest that never ends
			for i := 0; i < 1<<12 && r.Context().Err() == nil; i++ {
				if _, err := w.Write(make([]byte, 1<<16)); err != nil {
					return
				}
			}
		}
	case strings.Contains(r.URL.Path, "/blobs/"):
		h.blob(w, r)
	default:
		http.NotFound(w, r)
	}
}

func specsVersioned() (v struct {
	SchemaVersion int `json:"schemaVersion"`
}) {
	v.SchemaVersion = 2
	return
}

// endless writes zeros until the client goes away (bounded, so a broken
// client cannot keep the test running).
func endless(w http.ResponseWriter, r *http.Request) {
	for i := 0; i < 1<<14 && r.Context().Err() == nil; i++ {
		if _, err := w.Write(make([]byte, 1<<16)); err != nil {
			return
		}
	}
}

func gzipBomb(t *testing.T, n int64) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "filler", Mode: 0o644, Size: n, Typeflag: tar.TypeReg})
	chunk := make([]byte, 1<<20)
	for left := n; left > 0; left -= int64(len(chunk)) {
		tw.Write(chunk[:min(int64(len(chunk)), left)])
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// TestHostileRegistry: a registry that lies or stalls costs bounded bytes
// and time, and serves nothing.
func TestHostileRegistry(t *testing.T) {
	small := []byte("\x00asm\x01\x00\x00\x00")
	bomb := gzipBomb(t, 64<<20)
	tests := []struct {
		name    string
		reg     *hostileRegistry
		maxSize uint64
		want    string
	}{
		{"endless blob", &hostileRegistry{layer: content(sources.MediaTypeWasm, small), blob: endless}, 0, "trailing data"},
		{"layer over the limit", &hostileRegistry{layer: ocispec.Descriptor{MediaType: sources.MediaTypeWasm, Digest: digest.FromBytes(small), Size: 1 << 40}, blob: endless}, 0, "over the size limit"},
		{"huge manifest", &hostileRegistry{manifest: []byte(`{}`), manifestSize: 1 << 30, blob: endless}, 0, "over the size limit"},
		{"wrong digest", &hostileRegistry{layer: content(sources.MediaTypeWasm, small), blob: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("\x00asm\x01\x00\x00\x01"))
		}}, 0, "mismatch"},
		{"redirect to http off loopback", &hostileRegistry{layer: content(sources.MediaTypeWasm, small), blob: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://wasmtools.invalid/blob", http.StatusTemporaryRedirect)
		}}, 0, "plain http only on loopback"},
		{"slowloris", &hostileRegistry{layer: content(sources.MediaTypeWasm, bytes.Repeat([]byte{1}, 1<<20)), blob: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(1<<20))
			for r.Context().Err() == nil {
				w.Write([]byte{1})
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		}}, 0, "deadline exceeded"},
		{"gzip bomb", &hostileRegistry{layer: content(ocispec.MediaTypeImageLayerGzip, bomb), blob: func(w http.ResponseWriter, r *http.Request) {
			w.Write(bomb)
		}}, 1 << 20, "decompress"},
		{"no plugin layer", &hostileRegistry{layer: content("application/octet-stream", small), blob: endless}, 0, "no plugin layer"},
		{"redirect loop", &hostileRegistry{layer: content(sources.MediaTypeWasm, small), blob: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, r.URL.Path, http.StatusTemporaryRedirect)
		}}, 0, "more than 5 redirects"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.reg)
			defer srv.Close()
			m, err := sources.New(sources.Options{Dir: t.TempDir(), LinkDir: t.TempDir(), DockerConfig: "-", Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			host := strings.TrimPrefix(srv.URL, "http://")
			_, errs := m.Sync(context.Background(), []sources.Spec{{Name: "p", Source: "oci://" + host + "/x/p:v1", InsecureSkipSignature: true, MaxSize: tt.maxSize}})
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.want) {
				t.Fatalf("errs = %v, want %q", errs, tt.want)
			}
			if st, _ := m.Lookup("p"); st.SHA256 != "" {
				t.Errorf("something was served: %+v", st)
			}
		})
	}
}

func content(mediaType string, b []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
}

// dialRecorder is a client whose dials off loopback are recorded and fail
// (the test machine has no private network to reach): what a fetch would
// have reached. A dial of public, if set, reaches the test's server at
// loopback instead: a registry on a public address.
type dialRecorder struct {
	public, server string
	mu             sync.Mutex
	dialed         []string
}

func (d *dialRecorder) client(proxy func(*http.Request) (*url.URL, error)) *http.Client {
	var dialer net.Dialer
	return &http.Client{Transport: &http.Transport{Proxy: proxy, TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if d.public != "" && addr == d.public {
				return dialer.DialContext(ctx, network, d.server)
			}
			if host, _, _ := net.SplitHostPort(addr); net.ParseIP(host) == nil || !net.ParseIP(host).IsLoopback() {
				d.mu.Lock()
				d.dialed = append(d.dialed, addr)
				d.mu.Unlock()
				return nil, fmt.Errorf("test: %s not reachable", addr)
			}
			return dialer.DialContext(ctx, network, addr)
		}}}
}

func (d *dialRecorder) got() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.dialed)
}

// TestTokenRealmPrivate: a registry's WWW-Authenticate realm is the
// registry's choice, not the operator's: a public registry's realm on
// another host is held to the private-address rule of redirect hops, so
// it cannot make wasmtools send its token request (with the registry's
// login, if any) into the private network (oras-go refuses only
// loopback, link-local and metadata realms). A registry that is itself
// at a private address (a self-hosted GitLab's, whose token service is
// on another host) may name a private realm: the operator put it there.
func TestTokenRealmPrivate(t *testing.T) {
	realm := func(scheme string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+scheme+`://10.1.2.3:5001/token",service="registry",scope="repository:x/p:pull"`)
			w.WriteHeader(http.StatusUnauthorized)
		}
	}
	public := httptest.NewTLSServer(realm("https"))
	defer public.Close()
	private := httptest.NewServer(realm("http"))
	defer private.Close()
	const publicAddr = "203.0.113.7:443" // TEST-NET-3: a public address that is not ours
	tests := []struct {
		name, registry string
		asked          bool // the realm is asked for a token
	}{
		{"public registry", "203.0.113.7", false},
		{"private registry", strings.TrimPrefix(private.URL, "http://"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := dialRecorder{public: publicAddr, server: strings.TrimPrefix(public.URL, "https://")}
			m, err := sources.New(sources.Options{Dir: t.TempDir(), LinkDir: t.TempDir(), DockerConfig: "-", Timeout: time.Minute, Client: rec.client(nil)})
			if err != nil {
				t.Fatal(err)
			}
			_, errs := m.Sync(context.Background(), []sources.Spec{{Name: "p", Source: "oci://" + tt.registry + "/x/p:v1", InsecureSkipSignature: true,
				Credential: &sources.Credential{Username: "bot", Password: "s3cret"}}})
			if len(errs) != 1 {
				t.Fatalf("errs = %v", errs)
			}
			got := rec.got()
			if tt.asked {
				if !slices.Equal(got, []string{"10.1.2.3:5001"}) {
					t.Errorf("dialled %v, want the realm (%v)", got, errs)
				}
				return
			}
			if len(got) > 0 {
				t.Errorf("the token request was sent to %v", got)
			}
			if !errors.Is(errs[0], sources.ErrRedirectPrivate) {
				t.Fatalf("errs = %v, want %v", errs, sources.ErrRedirectPrivate)
			}
		})
	}
}

// TestRedirectPrivateThroughProxy: behind an HTTP proxy the proxy is what
// is dialled, so a redirect hop's address is checked before the request
// goes to the proxy: a public registry cannot have the proxy reach a
// private service for it.
func TestRedirectPrivateThroughProxy(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Method+" "+r.Host)
		mu.Unlock()
		http.Error(w, "test proxy: not reachable", http.StatusBadGateway)
	}))
	defer proxy.Close()
	proxyURL, _ := url.Parse(proxy.URL)
	small := []byte("\x00asm\x01\x00\x00\x00")
	srv := httptest.NewServer(&hostileRegistry{layer: content(sources.MediaTypeWasm, small), blob: func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://10.1.2.3/blob", http.StatusTemporaryRedirect)
	}})
	defer srv.Close()
	var rec dialRecorder
	// As NO_PROXY=localhost would: the registry directly, the rest
	// through the proxy.
	client := rec.client(func(r *http.Request) (*url.URL, error) {
		if ip := net.ParseIP(r.URL.Hostname()); ip != nil && ip.IsLoopback() {
			return nil, nil
		}
		return proxyURL, nil
	})
	m, err := sources.New(sources.Options{Dir: t.TempDir(), LinkDir: t.TempDir(), DockerConfig: "-", Timeout: time.Minute, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	_, errs := m.Sync(context.Background(), []sources.Spec{{Name: "p", Source: "oci://" + host + "/x/p:v1", InsecureSkipSignature: true}})
	mu.Lock()
	defer mu.Unlock()
	if len(asked) > 0 {
		t.Errorf("the proxy was asked for %v", asked)
	}
	if len(errs) != 1 || !errors.Is(errs[0], sources.ErrRedirectPrivate) {
		t.Fatalf("errs = %v, want %v", errs, sources.ErrRedirectPrivate)
	}
}

// TestBundleLayersBounded: a referrer the registry lists as a sigstore
// bundle may list thousands of bundle layers (the same blob, each read
// again): verification reads a bounded number of bundles in all, as it
// reads at most 32 signature payloads of the .sig format, and its error
// stays short.
func TestBundleLayersBounded(t *testing.T) {
	small := []byte("\x00asm\x01\x00\x00\x00")
	plugin, _ := json.Marshal(ocispec.Manifest{Versioned: specsVersioned(), MediaType: ocispec.MediaTypeImageManifest,
		Config: ocispec.DescriptorEmptyJSON, Layers: []ocispec.Descriptor{content(sources.MediaTypeWasm, small)}})
	pluginDesc := content(ocispec.MediaTypeImageManifest, plugin)
	bundle := []byte(`{}`)
	const layers = 5000
	ref := ocispec.Manifest{Versioned: specsVersioned(), MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: "application/vnd.dev.sigstore.bundle.v0.3+json", Config: ocispec.DescriptorEmptyJSON, Subject: &pluginDesc}
	for range layers {
		ref.Layers = append(ref.Layers, content("application/vnd.dev.sigstore.bundle.v0.3+json", bundle))
	}
	refBytes, _ := json.Marshal(ref)
	refDesc := content(ocispec.MediaTypeImageManifest, refBytes)
	refDesc.ArtifactType = ref.ArtifactType
	index, _ := json.Marshal(ocispec.Index{Versioned: specsVersioned(), MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{refDesc}})
	var mu sync.Mutex
	reads := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serve := func(mediaType string, b []byte) {
			w.Header().Set("Content-Type", mediaType)
			w.Header().Set("Docker-Content-Digest", digest.FromBytes(b).String())
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			if r.Method != http.MethodHead {
				w.Write(b)
			}
		}
		p := r.URL.Path
		switch {
		case p == "/v2/":
		case p == "/v2/x/p/manifests/v1" || p == "/v2/x/p/manifests/"+pluginDesc.Digest.String():
			serve(ocispec.MediaTypeImageManifest, plugin)
		case p == "/v2/x/p/manifests/"+refDesc.Digest.String():
			serve(ocispec.MediaTypeImageManifest, refBytes)
		case p == "/v2/x/p/referrers/"+pluginDesc.Digest.String():
			serve(ocispec.MediaTypeImageIndex, index)
		case p == "/v2/x/p/blobs/"+digest.FromBytes(bundle).String():
			mu.Lock()
			reads++
			mu.Unlock()
			serve("application/octet-stream", bundle)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pub := filepath.Join(t.TempDir(), "cosign.pub")
	os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)
	m, err := sources.New(sources.Options{Dir: t.TempDir(), LinkDir: t.TempDir(), DockerConfig: "-", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	_, errs := m.Sync(context.Background(), []sources.Spec{{Name: "p", Source: "oci://" + host + "/x/p:v1", PublicKeys: []string{pub}}})
	if len(errs) != 1 || !errors.Is(errs[0], sources.ErrSignature) {
		t.Fatalf("errs = %v, want %v", errs, sources.ErrSignature)
	}
	mu.Lock()
	defer mu.Unlock()
	if reads > 64 {
		t.Errorf("%d bundles read for one referrer", reads)
	}
	if n := len(errs[0].Error()); n > 16<<10 {
		t.Errorf("the error is %d bytes", n)
	}
}

// movingRegistry is a registry on loopback whose tag x/p:v1 names
// version n, set by the test: each version a plugin of its own.
type movingRegistry struct {
	mu    sync.Mutex
	n     int
	blobs map[digest.Digest][]byte
}

func (g *movingRegistry) move(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n = n
}

func (g *movingRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.blobs == nil {
		g.blobs = map[digest.Digest][]byte{}
	}
	layer := append([]byte("\x00asm\x01\x00\x00\x00\x00\x05\x03ver"), byte(g.n))
	g.blobs[digest.FromBytes(layer)] = layer
	man, _ := json.Marshal(ocispec.Manifest{Versioned: specsVersioned(), MediaType: ocispec.MediaTypeImageManifest,
		Config: ocispec.DescriptorEmptyJSON, Layers: []ocispec.Descriptor{content(sources.MediaTypeWasm, layer)}})
	g.blobs[digest.FromBytes(man)] = man
	serve := func(mediaType string, b []byte) {
		w.Header().Set("Content-Type", mediaType)
		w.Header().Set("Docker-Content-Digest", digest.FromBytes(b).String())
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		if r.Method != http.MethodHead {
			w.Write(b)
		}
	}
	_, ref, _ := strings.Cut(r.URL.Path, "/manifests/")
	_, blob, _ := strings.Cut(r.URL.Path, "/blobs/")
	switch {
	case r.URL.Path == "/v2/":
	case ref == "v1":
		serve(ocispec.MediaTypeImageManifest, man)
	case ref != "" && g.blobs[digest.Digest(ref)] != nil:
		serve(ocispec.MediaTypeImageManifest, g.blobs[digest.Digest(ref)])
	case blob != "" && g.blobs[digest.Digest(blob)] != nil:
		serve("application/octet-stream", g.blobs[digest.Digest(blob)])
	default:
		http.NotFound(w, r)
	}
}

func storedBlobs(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

// serveMoving serves a movingRegistry until the test ends, and returns
// it and the spec of its plugin p.
func serveMoving(t *testing.T) (*movingRegistry, []sources.Spec) {
	reg := &movingRegistry{}
	srv := httptest.NewServer(reg)
	t.Cleanup(srv.Close)
	return reg, []sources.Spec{{Name: "p", Source: "oci://" + strings.TrimPrefix(srv.URL, "http://") + "/x/p:v1", InsecureSkipSignature: true}}
}

// storeManager makes a manager of the store folder, with a link folder of
// its own; log, if not nil, is written its log.
func storeManager(t *testing.T, store string, log io.Writer) *sources.Manager {
	t.Helper()
	opts := sources.Options{Dir: store, LinkDir: t.TempDir(), DockerConfig: "-", Timeout: time.Minute}
	if log != nil {
		opts.Logger = slog.New(slog.NewTextHandler(log, nil))
	}
	m, err := sources.New(opts)
	if err != nil {
		t.Fatalf("New over store %s: %v", store, err)
	}
	return m
}

// TestStoreBoundedByMovingTag: a tag that moves on every refresh (a
// registry, or a plugin author signing a version a minute) leaves in the
// store the versions served, not every version ever fetched; a version
// another manager sharing the store still serves is kept.
func TestStoreBoundedByMovingTag(t *testing.T) {
	reg, spec := serveMoving(t)
	store := t.TempDir()
	a, b := storeManager(t, store, nil), storeManager(t, store, nil)
	ctx := context.Background()
	if _, errs := b.Sync(ctx, spec); len(errs) > 0 {
		t.Fatal(errs)
	}
	kept, _ := b.Lookup("p")
	for n := 1; n <= 20; n++ {
		reg.move(n)
		if changed, errs := a.Sync(ctx, spec); len(errs) > 0 || !changed {
			t.Fatalf("version %d: changed %v, %v", n, changed, errs)
		}
	}
	got := storedBlobs(t, store)
	now, _ := a.Lookup("p")
	if len(got) != 2 || !slices.Contains(got, now.SHA256) || !slices.Contains(got, kept.SHA256) {
		t.Errorf("store holds %d blobs after 21 versions, want 2 (a's current %s, b's %s): %v", len(got), now.SHA256, kept.SHA256, got)
	}
	served := filepath.Join(b.LinkDir(), "p.wasm")
	if wasm, err := os.ReadFile(served); err != nil || b.Check(served, wasm) != nil {
		t.Errorf("b's version, still served: %v", err)
	}
}

// TestTokenExchangeStalls: a token endpoint that never answers holds the
// fetch for the stage timeout only.
func TestTokenExchangeStalls(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			<-r.Context().Done()
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="http://`+r.Host+`/token",service="registry"`)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer srv.Close()
	m, err := sources.New(sources.Options{Dir: t.TempDir(), LinkDir: t.TempDir(), DockerConfig: "-", StageTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	_, errs := m.Sync(context.Background(), []sources.Spec{{Name: "p", Source: "oci://" + host + "/x/p:v1", InsecureSkipSignature: true}})
	if len(errs) != 1 || !errors.Is(errs[0], sources.ErrStageTimeout) {
		t.Fatalf("errs = %v, want %v", errs, sources.ErrStageTimeout)
	}
}

// TestTokenRealmPrivateUnicodeHost: a realm's host written in other
// characters that name the same host once mapped for DNS (IDNA: full-width
// digits and letters) was recorded as written, while net/http dials the
// mapped name: the dial was not held to the private-address rule, and a
// public registry sent the token request, with the login, to 10.1.2.3.
func TestTokenRealmPrivateUnicodeHost(t *testing.T) {
	public := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="https://１０.１.２.３:5001/token",service="registry",scope="repository:x/p:pull"`)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer public.Close()
	rec := dialRecorder{public: "203.0.113.7:443", server: strings.TrimPrefix(public.URL, "https://")}
	m, err := sources.New(sources.Options{Dir: t.TempDir(), LinkDir: t.TempDir(), DockerConfig: "-", Timeout: time.Minute, Client: rec.client(nil)})
	if err != nil {
		t.Fatal(err)
	}
	_, errs := m.Sync(context.Background(), []sources.Spec{{Name: "p", Source: "oci://203.0.113.7/x/p:v1", InsecureSkipSignature: true,
		Credential: &sources.Credential{Username: "bot", Password: "s3cret"}}})
	if got := rec.got(); len(got) > 0 {
		t.Errorf("the token request was sent to %v", got)
	}
	if len(errs) != 1 || !errors.Is(errs[0], sources.ErrRedirectPrivate) {
		t.Fatalf("errs = %v, want %v", errs, sources.ErrRedirectPrivate)
	}
}

// TestStoreNotWritableServes: a store the process cannot write in (an
// image's --source-dir filled by serve --prepare, under a read-only root
// file system) served its stored versions until the store's garbage
// collection made New register its link folder there, and fail when it
// could not: no remote plugin was served at all. Here Dir/links cannot be
// made (a file is in its place), as on a read-only store.
func TestStoreNotWritableServes(t *testing.T) {
	_, spec := serveMoving(t)
	store := t.TempDir()
	if err := os.WriteFile(filepath.Join(store, "links"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	m := storeManager(t, store, nil)
	if _, errs := m.Sync(context.Background(), spec); len(errs) > 0 {
		t.Fatal(errs)
	}
}

// TestStoreKeepsVersionsOfUnseenLinks: processes that share the store but
// not a view of the file system (two containers mounting one volume, a
// service with a private /tmp) cannot see each other's link folders. A
// registration renewed recently whose folder is not found here is not a
// manager that ended: what it serves is unknown, so no version is removed
// (once said in the log, naming the folder), until its registration goes
// unrenewed for longer than any manager leaves it.
func TestStoreKeepsVersionsOfUnseenLinks(t *testing.T) {
	reg, spec := serveMoving(t)
	store := t.TempDir()
	if err := os.MkdirAll(filepath.Join(store, "links"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The other process's registration: its folder is in its own view.
	elsewhere := filepath.Join(t.TempDir(), "wasmtools-links-elsewhere")
	other := filepath.Join(store, "links", "00112233445566778899aabbccddeeff")
	if err := os.WriteFile(other, []byte(elsewhere), 0o644); err != nil {
		t.Fatal(err)
	}
	var log lockedBuffer
	m := storeManager(t, store, &log)
	ctx := context.Background()
	var served []string
	for n := range 5 {
		reg.move(n)
		if _, errs := m.Sync(ctx, spec); len(errs) > 0 {
			t.Fatalf("version %d: %v", n, errs)
		}
		st, _ := m.Lookup("p")
		served = append(served, st.SHA256)
	}
	if got := storedBlobs(t, store); len(got) != len(served) {
		t.Errorf("store holds %d blobs, want the %d versions fetched (another process's links cannot be seen): %v", len(got), len(served), got)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("the other process's registration: %v", err)
	}
	if n := strings.Count(log.String(), elsewhere); n != 1 {
		t.Errorf("the unseen folder is named %d times in the log, want once:\n%s", n, log.String())
	}

	// Unrenewed for 8 days, the registration is of a manager that ended.
	old := time.Now().Add(-8 * 24 * time.Hour)
	if err := os.Chtimes(other, old, old); err != nil {
		t.Fatal(err)
	}
	reg.move(5)
	if _, errs := m.Sync(ctx, spec); len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := storedBlobs(t, store); slices.Contains(got, served[4]) {
		t.Errorf("the version served before is kept after the other registration lapsed: %v", got)
	}
	if _, err := os.Stat(other); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the lapsed registration is kept: %v", err)
	}
}

// lockedBuffer is a log's writer, written from several goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestStoreForgetsEndedManagers: a manager of this view whose link folder
// is gone ended (its versions are removed at once, as is its
// registration), and a manager closed unregisters.
func TestStoreForgetsEndedManagers(t *testing.T) {
	reg, spec := serveMoving(t)
	store := t.TempDir()
	var log lockedBuffer
	a, b := storeManager(t, store, &log), storeManager(t, store, &log)
	ctx := context.Background()
	for _, m := range []*sources.Manager{a, b} {
		if _, errs := m.Sync(ctx, spec); len(errs) > 0 {
			t.Fatal(errs)
		}
	}
	if err := os.RemoveAll(b.LinkDir()); err != nil { // b ended without Close
		t.Fatal(err)
	}
	reg.move(1)
	if _, errs := a.Sync(ctx, spec); len(errs) > 0 {
		t.Fatal(errs)
	}
	now, _ := a.Lookup("p")
	if got := storedBlobs(t, store); !slices.Equal(got, []string{now.SHA256}) {
		t.Errorf("store holds %v, want only a's version %s", got, now.SHA256)
	}
	regs, _ := os.ReadDir(filepath.Join(store, "links"))
	if len(regs) != 1 {
		t.Errorf("%d registrations, want a's alone", len(regs))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if regs, _ := os.ReadDir(filepath.Join(store, "links")); len(regs) != 0 {
		t.Errorf("%d registrations after Close, want none", len(regs))
	}
	if strings.Contains(log.String(), "cannot be seen") {
		t.Errorf("a link folder of this view was taken for unseen:\n%s", log.String())
	}
}

// TestStoreSweepsAfterUnseenEnds: versions unlinked while removal was off
// (the registration of a process in another view live) were kept for
// good once it ended, since a version was considered only when its link
// moved on: after a week of a tag moving, the disk kept every version.
// A Sync with removal on sweeps the whole store: a version no link or
// record names goes once older than any fetch of another process could
// be between storing and linking it, and so does a write a crash left
// half done; a version another manager links, one a record names and
// one just stored are kept, and nothing goes while the other process's
// registration is live.
func TestStoreSweepsAfterUnseenEnds(t *testing.T) {
	reg, spec := serveMoving(t)
	store := t.TempDir()
	ctx := context.Background()
	b := storeManager(t, store, nil)
	if _, errs := b.Sync(ctx, spec); len(errs) > 0 {
		t.Fatal(errs)
	}
	linked, _ := b.Lookup("p")
	// The registration of a process in another view (another container
	// on the volume): removal is off while it is live.
	other := filepath.Join(store, "links", "00112233445566778899aabbccddeeff")
	body, _ := json.Marshal(map[string]string{"dir": "/tmp/wasmtools-links-elsewhere", "view": "linux boot another container"})
	if err := os.WriteFile(other, body, 0o644); err != nil {
		t.Fatal(err)
	}
	a := storeManager(t, store, nil)
	var served []string
	for n := 1; n <= 5; n++ {
		reg.move(n)
		if _, errs := a.Sync(ctx, spec); len(errs) > 0 {
			t.Fatalf("version %d: %v", n, errs)
		}
		st, _ := a.Lookup("p")
		served = append(served, st.SHA256)
	}
	// An offline start's record of another source names one of them.
	recorded := served[1]
	rec, _ := json.Marshal(map[string]string{"source": "oci://registry.example/x/q:v1", "sha256": recorded, "verified": "skipped"})
	if err := os.WriteFile(filepath.Join(store, "index", digest.FromString("q").Encoded()+".json"), rec, 0o644); err != nil {
		t.Fatal(err)
	}
	blobs := filepath.Join(store, "blobs", "sha256")
	// A week passes: every version and a write left half done by a crash
	// grow old.
	crashed := filepath.Join(blobs, "."+digest.FromString("crashed").Encoded()+".123")
	if err := os.WriteFile(crashed, []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-8 * 24 * time.Hour)
	ents, _ := os.ReadDir(blobs)
	for _, e := range ents {
		if err := os.Chtimes(filepath.Join(blobs, e.Name()), old, old); err != nil {
			t.Fatal(err)
		}
	}
	// Another process's fetch has just stored a version, not yet linked,
	// and is writing another.
	fresh := digest.FromString("just fetched").Encoded()
	writing := filepath.Join(blobs, "."+digest.FromString("being written").Encoded()+".456")
	for _, p := range []string{filepath.Join(blobs, fresh), writing} {
		if err := os.WriteFile(p, []byte("\x00asm"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	all := storedBlobs(t, store)
	if _, errs := a.Sync(ctx, spec); len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := storedBlobs(t, store); !slices.Equal(got, all) {
		t.Errorf("removed while another view's registration is live: %v, had %v", got, all)
	}

	// Its registration lapses (unrenewed for 8 days): the next Sync, with
	// no link moving, brings the store back to the versions in use.
	if err := os.Chtimes(other, old, old); err != nil {
		t.Fatal(err)
	}
	if _, errs := a.Sync(ctx, spec); len(errs) > 0 {
		t.Fatal(errs)
	}
	want := []string{linked.SHA256, served[4], recorded, fresh}
	slices.Sort(want)
	if got := storedBlobs(t, store); !slices.Equal(got, want) {
		t.Errorf("store holds %d versions %v, want %d: b's linked %s, a's %s, the recorded %s, the one just fetched %s",
			len(got), got, len(want), linked.SHA256, served[4], recorded, fresh)
	}
	if _, err := os.Stat(crashed); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an old write left half done is kept: %v", err)
	}
	if _, err := os.Stat(writing); err != nil {
		t.Errorf("a write under way: %v", err)
	}
	served0 := filepath.Join(b.LinkDir(), "p.wasm")
	if wasm, err := os.ReadFile(served0); err != nil || b.Check(served0, wasm) != nil {
		t.Errorf("b's version, still served: %v", err)
	}
}

// TestLinkedWhileOthersFetch: Options.Linked is told of a source as soon
// as it is linked, while another source's registry holds a blob back, so
// that a reloader not watching the link folder can serve it without
// waiting for the slowest source.
func TestLinkedWhileOthersFetch(t *testing.T) {
	_, specs := serveMoving(t)
	slowReg := &movingRegistry{}
	hold, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/") && r.Method == http.MethodGet {
			once.Do(func() { close(held) })
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		slowReg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hold) }) }) // before srv.Close, which waits for the handler
	specs = append(specs, sources.Spec{Name: "slow", Source: "oci://" + strings.TrimPrefix(srv.URL, "http://") + "/x/p:v1", InsecureSkipSignature: true})
	linked := make(chan string, len(specs))
	m, err := sources.New(sources.Options{Dir: t.TempDir(), LinkDir: t.TempDir(), DockerConfig: "-", Timeout: time.Minute,
		Linked: func(name string) { linked <- name }})
	if err != nil {
		t.Fatal(err)
	}
	synced := make(chan []error, 1)
	go func() {
		_, errs := m.Sync(context.Background(), specs)
		synced <- errs
	}()
	<-held
	select {
	case name := <-linked:
		if name != "p" {
			t.Fatalf("linked %q while the slow source is held, want p", name)
		}
	case errs := <-synced:
		t.Fatalf("Sync returned while the slow source is held: %v", errs)
	}
	if _, err := os.Stat(filepath.Join(m.LinkDir(), "p.wasm")); err != nil {
		t.Fatalf("told p is linked: %v", err)
	}
	release.Do(func() { close(hold) })
	if errs := <-synced; len(errs) > 0 {
		t.Fatal(errs)
	}
	if name := <-linked; name != "slow" {
		t.Fatalf("linked %q once released, want slow", name)
	}
}

// ageAll sets the time of every file under dir to old.
func ageAll(t *testing.T, dir string, old time.Time) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Chtimes(path, old, old)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// indexRecords returns the names in the store's index, temporary files
// included.
func indexRecords(t *testing.T, store string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(store, "index"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// A source removed from the configuration leaves its record in the index
// (an offline start's), which held its version in the store for good.
// Once unrenewed for a month (no server of that source has run since:
// TestStoreKeepsRecordsOfStoppedServers), a Sync removes it, and the
// version with it; the records of sources configured stay however old
// (a registry away for days), as does another manager's, renewed
// lately. Writes a crash left half done (".record.*" in the index,
// ".link.*" among the registrations) go once old (a day), not while
// under way.
func TestStoreSweepsUnconfiguredRecords(t *testing.T) {
	// serveMoving's registry, which can be away.
	reg := &movingRegistry{}
	var away atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if away.Load() {
			http.Error(w, "away", http.StatusServiceUnavailable)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	spec := []sources.Spec{{Name: "p", Source: "oci://" + strings.TrimPrefix(srv.URL, "http://") + "/x/p:v1", InsecureSkipSignature: true}}
	q := []sources.Spec{{Name: "q", Source: strings.Replace(spec[0].Source, "/x/p:", "/x/q:", 1), InsecureSkipSignature: true}}
	store := t.TempDir()
	ctx := context.Background()
	a := storeManager(t, store, nil)
	reg.move(1)
	if _, errs := a.Sync(ctx, q); len(errs) > 0 {
		t.Fatal(errs)
	}
	qst, _ := a.Lookup("q")
	// q leaves the configuration for p, at another version.
	reg.move(2)
	if _, errs := a.Sync(ctx, spec); len(errs) > 0 {
		t.Fatal(errs)
	}
	pst, _ := a.Lookup("p")
	if got := storedBlobs(t, store); !slices.Contains(got, qst.SHA256) {
		t.Fatalf("q's version, recorded, removed at once: %v", got)
	}
	records := indexRecords(t, store)
	if len(records) != 2 {
		t.Fatalf("index: %v; want p's and q's records", records)
	}

	index, links := filepath.Join(store, "index"), filepath.Join(store, "links")
	oldTemps := []string{filepath.Join(index, ".record.1234"), filepath.Join(links, ".link.5678")}
	for _, p := range oldTemps {
		if err := os.WriteFile(p, []byte("{"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A month and more passes (recordLapse).
	ageAll(t, store, time.Now().Add(-31*24*time.Hour))
	// Meanwhile another manager recorded a source of its own, and writes
	// are under way.
	others := filepath.Join(index, strings.Repeat("ab", 32)+".json")
	rec, _ := json.Marshal(map[string]string{"source": "oci://registry.example/x/r:v1", "sha256": pst.SHA256, "verified": "skipped"})
	freshTemps := []string{filepath.Join(index, ".record.9999"), filepath.Join(links, ".link.9999")}
	for _, p := range append([]string{others}, freshTemps...) {
		if err := os.WriteFile(p, rec, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The registry is away: p is not verified again (its record not
	// written again), and p's version goes on.
	away.Store(true)
	if _, errs := a.Sync(ctx, spec); len(errs) == 0 {
		t.Fatal("a registry away: no error")
	}

	got := indexRecords(t, store)
	want := []string{filepath.Base(others), ".record.9999"}
	for _, r := range records {
		if b, _ := os.ReadFile(filepath.Join(index, r)); bytes.Contains(b, []byte("/x/p:")) {
			want = append(want, r)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("index after a month: %v; want p's record, another manager's fresh one and the write under way: %v", got, want)
	}
	if got := storedBlobs(t, store); slices.Contains(got, qst.SHA256) || !slices.Contains(got, pst.SHA256) {
		t.Errorf("store after a month: %v; want q's version %s gone, p's %s kept", got, qst.SHA256, pst.SHA256)
	}
	for _, p := range oldTemps {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s, a month old: %v", p, err)
		}
	}
	for _, p := range freshTemps {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s, under way: %v", p, err)
		}
	}
}

// oldStray puts in the store a version nothing names, a day old, which
// the next sweep removes, and returns its path.
func oldStray(t *testing.T, store string) string {
	t.Helper()
	stray := filepath.Join(store, "blobs", "sha256", strings.Repeat("cd", 32))
	if err := os.WriteFile(stray, []byte("\x00asm"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-25 * time.Hour)
	if err := os.Chtimes(stray, old, old); err != nil {
		t.Fatal(err)
	}
	return stray
}

// blockingLog is a log writer that holds the first line containing at
// until release is closed.
type blockingLog struct {
	at      string
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockingLog) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(b.at)) {
		b.once.Do(func() {
			close(b.held)
			<-b.release
		})
	}
	return len(p), nil
}

// A Sync's sweep reads the store's folders (a network file system,
// thousands of versions) without holding the lock of Status, Lookup and
// Check, which every load of a plugin calls: held at its log line, the
// sweep lets Lookup answer.
func TestStoreSweepDoesNotHoldLookup(t *testing.T) {
	reg, spec := serveMoving(t)
	store := t.TempDir()
	ctx := context.Background()
	log := &blockingLog{at: "versions no longer served removed", held: make(chan struct{}), release: make(chan struct{})}
	m := storeManager(t, store, log)
	for n := 1; n <= 2; n++ {
		reg.move(n)
		if _, errs := m.Sync(ctx, spec); len(errs) > 0 {
			t.Fatal(errs)
		}
	}
	// An old version nothing names: the next sweep removes it, and says so.
	oldStray(t, store)
	answersWhileHeld(t, log, func() { m.Sync(ctx, spec) }, func() { m.Lookup("p") }, "Lookup waited for the sweep")
}

// answersWhileHeld runs work until log holds it, then fails the test
// unless call returns meanwhile (saying why), and waits for work to end.
func answersWhileHeld(t *testing.T, log *blockingLog, work, call func(), why string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		work()
	}()
	<-log.held
	answered := make(chan struct{})
	go func() {
		call()
		close(answered)
	}()
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Error(why)
	}
	close(log.release)
	<-done
}

// When a link moves off a version, reading what may still serve it (every
// record of the index, every registered link folder: a network file
// system, thousands of versions) does not hold the lock of Status, Lookup
// and Check, which every load of a plugin calls: held at its log line
// (the users could not be read: a record of the index unreadable), the
// link's move lets a load's Check answer.
func TestStoreForgetDoesNotHoldCheck(t *testing.T) {
	reg, spec := serveMoving(t)
	store := t.TempDir()
	ctx := context.Background()
	log := &blockingLog{at: "a version no longer served is kept", held: make(chan struct{}), release: make(chan struct{})}
	m := storeManager(t, store, log)
	reg.move(1)
	if _, errs := m.Sync(ctx, spec); len(errs) > 0 {
		t.Fatal(errs)
	}
	if err := os.WriteFile(filepath.Join(store, "index", strings.Repeat("ef", 32)+".json"), []byte("not a record"), 0o644); err != nil {
		t.Fatal(err)
	}
	reg.move(2)
	check := func() { m.Check(filepath.Join(m.LinkDir(), "p.wasm"), nil) }
	answersWhileHeld(t, log, func() { m.Sync(ctx, spec) }, check, "Check waited for forget's reading of the store")
}

// Whoever can write a store shared by several users can replace its
// folders with symbolic links: the sweep, run as another user, must
// remove nothing outside the store through them. index pointing at a
// folder of the victim's (~/.docker, whose config.json holds registry
// logins) had every old .json file there removed; links pointing at one
// had its ".link.*" files a day old and every other file a week old
// removed; blobs/sha256 its files named like a digest a day old.
func TestStoreSweepStaysInStore(t *testing.T) {
	reg, spec := serveMoving(t)
	reg.move(1)
	ctx := context.Background()
	old := time.Now().Add(-40 * 24 * time.Hour)
	outsider := func(names ...string) (string, []string) {
		dir := t.TempDir()
		var paths []string
		for _, n := range names {
			p := filepath.Join(dir, n)
			if err := os.WriteFile(p, []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
			paths = append(paths, p)
		}
		return dir, paths
	}
	for _, sub := range []string{"index", filepath.Join("blobs", "sha256"), "links"} {
		t.Run(filepath.Base(sub), func(t *testing.T) {
			store := t.TempDir()
			out, victims := outsider("config.json", ".record.1", ".link.1", "authorized_keys", strings.Repeat("ab", 32))
			if err := os.MkdirAll(filepath.Dir(filepath.Join(store, sub)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(out, filepath.Join(store, sub)); err != nil {
				t.Fatal(err)
			}
			m := storeManager(t, store, nil)
			m.Sync(ctx, spec)
			for _, p := range victims {
				if _, err := os.Lstat(p); err != nil {
					t.Errorf("a store whose %s is a link to %s: the sweep removed %s outside it: %v", sub, out, filepath.Base(p), err)
				}
			}
		})
	}
}

// A store shared by servers of several configurations (the default
// --source-dir is one a user: every project's stdio server) keeps what
// the offline start of one stopped for a few days serves: its records,
// no longer renewed while it is stopped, and their versions, though
// another configuration's server runs and sweeps the store meanwhile.
// The day after which the sweep took them for a removed source's left
// it, restarted without the network, nothing to serve.
func TestStoreKeepsRecordsOfStoppedServers(t *testing.T) {
	reg, p := serveMoving(t)
	store := t.TempDir()
	// a serves p, b q (at another version); then a's server stops.
	a, b := storeManager(t, store, nil), storeManager(t, store, nil)
	q := []sources.Spec{{Name: "q", Source: strings.Replace(p[0].Source, "/x/p:", "/x/q:", 1), InsecureSkipSignature: true}}
	ctx := context.Background()
	for n, run := range []func() []error{
		func() []error { _, errs := a.Sync(ctx, p); return errs },
		func() []error { _, errs := b.Sync(ctx, q); return errs },
	} {
		reg.move(n + 1)
		if errs := run(); len(errs) > 0 {
			t.Fatal(errs)
		}
	}
	served, _ := a.Lookup("p")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// Three days pass; b refreshes.
	ageAll(t, store, time.Now().Add(-3*24*time.Hour))
	if _, errs := b.Sync(ctx, q); len(errs) > 0 {
		t.Fatal(errs)
	}
	// a's server starts again, the registry out of reach: Restore asks
	// none.
	again := storeManager(t, store, nil)
	names, errs := again.Restore(ctx, p)
	st, _ := again.Lookup("p")
	if !slices.Equal(names, []string{"p"}) || st.SHA256 != served.SHA256 {
		t.Errorf("a server stopped for three days, started offline: restored %v (%v), p %+v; want p at %s", names, errs, st, served.SHA256)
	}
}

// syncedStore returns a manager of a store of its own, synced once with
// the spec returned (serveMoving's, at version 1).
func syncedStore(t *testing.T) (*sources.Manager, string, []sources.Spec) {
	t.Helper()
	reg, spec := serveMoving(t)
	reg.move(1)
	store := t.TempDir()
	m := storeManager(t, store, nil)
	if _, errs := m.Sync(context.Background(), spec); len(errs) > 0 {
		t.Fatal(errs)
	}
	return m, store, spec
}

// A file of the index that is not a record (named otherwise than a
// record is: an operator's note, an editor's backup) is not read as one:
// unreadable as a record, it turned the store's cleanup off for good
// (every sweep and forget keeps everything when a record cannot be read).
func TestStoreIgnoresForeignIndexFiles(t *testing.T) {
	m, store, spec := syncedStore(t)
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(store, "index", "notes.json"), []byte("not a record"), 0o644); err != nil {
		t.Fatal(err)
	}
	stray := oldStray(t, store)
	if _, errs := m.Sync(ctx, spec); len(errs) > 0 {
		t.Fatal(errs)
	}
	if _, err := os.Stat(stray); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a version nothing names, a day old, beside a note in the index: %v; want it removed", err)
	}
}

// A record replaced by a symbolic link to a file outside the store (by
// whoever can write a shared store) does not have its renewal change
// that file's time: the renewal followed the link.
func TestStoreRenewalStaysInStore(t *testing.T) {
	m, store, spec := syncedStore(t)
	ctx := context.Background()
	records, _ := filepath.Glob(filepath.Join(store, "index", "*.json"))
	if len(records) != 1 {
		t.Fatalf("records %v, want p's", records)
	}
	victim := filepath.Join(t.TempDir(), "notes")
	if err := os.WriteFile(victim, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-40 * 24 * time.Hour).Truncate(time.Second)
	if err := os.Chtimes(victim, old, old); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(records[0]); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, records[0]); err != nil {
		t.Fatal(err)
	}
	m.Sync(ctx, spec)
	info, err := os.Stat(victim)
	if err != nil {
		t.Fatal(err)
	}
	if !info.ModTime().Equal(old) {
		t.Errorf("a file outside the store a record links to: its time set to %v; want it untouched at %v", info.ModTime(), old)
	}
}

// Whoever can write a store shared by several users can replace a file
// of it with a symbolic link to one outside: what the store reads (a
// record, a blob, a registration) is read through the store's root, so
// that the link is not followed out of it. Followed, a record or a blob
// outside was served by an offline start, and a record or a registration
// outside had the sweep keep what it names (or everything).
func TestStoreReadsStayInStore(t *testing.T) {
	// moveOut replaces the store's file p with a link to a copy outside.
	moveOut := func(t *testing.T, p string) {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), filepath.Base(p))
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(out, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, which := range []string{"record", "blob"} {
		t.Run("restore/"+which, func(t *testing.T) {
			m, store, spec := syncedStore(t)
			served, _ := m.Lookup("p")
			p := filepath.Join(store, "blobs", "sha256", served.SHA256)
			if which == "record" {
				records, _ := filepath.Glob(filepath.Join(store, "index", "*.json"))
				if len(records) != 1 {
					t.Fatalf("records %v, want p's", records)
				}
				p = records[0]
			}
			moveOut(t, p)
			names, errs := storeManager(t, store, nil).Restore(context.Background(), spec)
			if slices.Contains(names, "p") {
				t.Errorf("the store's %s a link to a file outside it: an offline start restored p (%v); want it refused", which, errs)
			}
		})
	}
	plant := func(t *testing.T, store, sub, name, body string) {
		t.Helper()
		out := filepath.Join(t.TempDir(), "planted")
		if err := os.WriteFile(out, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(out, filepath.Join(store, sub, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, sub := range []string{"index", "links"} {
		t.Run("sweep/"+sub, func(t *testing.T) {
			m, store, spec := syncedStore(t)
			stray := oldStray(t, store)
			if sub == "index" {
				plant(t, store, sub, strings.Repeat("ef", 32)+".json", `{"source":"elsewhere","sha256":"`+filepath.Base(stray)+`"}`)
			} else {
				plant(t, store, sub, "planted", `{"dir":"/elsewhere","view":"another"}`)
			}
			if _, errs := m.Sync(context.Background(), spec); len(errs) > 0 {
				t.Fatal(errs)
			}
			if _, err := os.Stat(stray); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a link in the store's %s to a file outside it: a version nothing in the store names, a day old: %v; want it removed", sub, err)
			}
		})
	}
}

// Whoever can write a store shared by several users can replace its
// folders with symbolic links: the manager, run as another user, must
// write nothing outside the store through them (a registration, a
// record, a blob or a temporary file of one, in a folder of the
// victim's), whether the link was there when it started or put there
// between two Syncs.
func TestStoreWritesStayInStore(t *testing.T) {
	for _, sub := range []string{"index", "links", filepath.Join("blobs", "sha256"), "blobs"} {
		for _, later := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/later=%v", filepath.Base(sub), later), func(t *testing.T) {
				reg, spec := serveMoving(t)
				reg.move(1)
				ctx := context.Background()
				store, out := t.TempDir(), t.TempDir()
				redirect := func() {
					t.Helper()
					p := filepath.Join(store, sub)
					if err := os.RemoveAll(p); err != nil {
						t.Fatal(err)
					}
					if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.Symlink(out, p); err != nil {
						t.Fatal(err)
					}
				}
				if !later {
					redirect()
				}
				m := storeManager(t, store, nil)
				m.Sync(ctx, spec)
				if later {
					redirect()
					reg.move(2)
					m.Sync(ctx, spec)
				}
				// Before Close too: it removes the registration it wrote.
				for _, step := range []string{"Sync", "Close"} {
					if step == "Close" {
						m.Close()
					}
					if ents, _ := os.ReadDir(out); len(ents) > 0 {
						var names []string
						for _, e := range ents {
							names = append(names, e.Name())
						}
						t.Errorf("a store whose %s is a link to %s: after %s, written there, outside the store: %v", sub, out, step, names)
					}
				}
			})
		}
	}
}
