package sources_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/wasmtools/wasmtools/internal/sources"
	"github.com/wasmtools/wasmtools/internal/sources/sourcestest"
)

// fakeWasm is a distinct module header for each version: the sources
// package does not compile what it fetches.
func fakeWasm(t *testing.T) []byte {
	b := []byte("\x00asm\x01\x00\x00\x00\x00\x09\x07version")
	tail := make([]byte, 16)
	rand.Read(tail)
	return append(b, tail...)
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func newManager(t *testing.T, client *http.Client) *sources.Manager {
	t.Helper()
	m, err := sources.New(sources.Options{Dir: t.TempDir(), LinkDir: t.TempDir(), Client: client, DockerConfig: "-", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// served returns the bytes the manager's link for name points at, and
// checks them as the reloader does on load.
func served(t *testing.T, m *sources.Manager, name string) []byte {
	t.Helper()
	path := filepath.Join(m.LinkDir(), name+".wasm")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := m.Check(path, b); err != nil {
		t.Fatalf("check: %v", err)
	}
	return b
}

// TestOCI runs the cases against a real registry: a signed plugin
// (plain Wasm artifact and hyper-mcp's tarball) is served; a missing
// signature, another key's signature and a tampered blob are refused with
// the old version serving; a moved tag is picked up once signed.
func TestOCI(t *testing.T) {
	cosign := sourcestest.Cosign(t)
	host, storage := sourcestest.Registry(t)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "a"), 0o755)
	os.MkdirAll(filepath.Join(dir, "b"), 0o755)
	key, pub := sourcestest.KeyPair(t, cosign, filepath.Join(dir, "a"))
	otherKey, otherPub := sourcestest.KeyPair(t, cosign, filepath.Join(dir, "b"))
	ctx := context.Background()

	v1 := fakeWasm(t)
	d1 := sourcestest.Push(t, host, "plugins/echo", "v1", sources.MediaTypeWasm, v1)
	sourcestest.Sign(t, cosign, key, host+"/plugins/echo@"+d1)
	m := newManager(t, nil)
	spec := sources.Spec{Name: "echo", Source: "oci://" + host + "/plugins/echo:v1", PublicKeys: []string{pub}}
	changed, errs := m.Sync(ctx, []sources.Spec{spec})
	if len(errs) > 0 || !changed {
		t.Fatalf("signed plugin: changed %v, %v", changed, errs)
	}
	if got := served(t, m, "echo"); !bytes.Equal(got, v1) {
		t.Fatal("served bytes differ from those pushed")
	}
	st, _ := m.Lookup("echo")
	if st.Digest != d1 || st.SHA256 != sha(v1) || !strings.Contains(st.Verified, pub) {
		t.Errorf("status = %+v, want digest %s", st, d1)
	}
	// The same tag again: nothing to do.
	if changed, errs := m.Sync(ctx, []sources.Spec{spec}); changed || len(errs) > 0 {
		t.Errorf("second sync: changed %v, %v", changed, errs)
	}

	t.Run("hyper-mcp tarball", func(t *testing.T) {
		w := fakeWasm(t)
		d := sourcestest.Push(t, host, "tuananh/time-plugin", "latest", ocispec.MediaTypeImageLayerGzip, sourcestest.Tarball(t, w))
		sourcestest.Sign(t, cosign, key, host+"/tuananh/time-plugin@"+d)
		m := newManager(t, nil)
		if _, errs := m.Sync(ctx, []sources.Spec{{Name: "time", Source: "oci://" + host + "/tuananh/time-plugin", PublicKeys: []string{pub}}}); len(errs) > 0 {
			t.Fatal(errs)
		}
		if !bytes.Equal(served(t, m, "time"), w) {
			t.Error("plugin.wasm not extracted")
		}
	})

	t.Run("missing signature", func(t *testing.T) {
		d := sourcestest.Push(t, host, "plugins/unsigned", "v1", sources.MediaTypeWasm, fakeWasm(t))
		m := newManager(t, nil)
		_, errs := m.Sync(ctx, []sources.Spec{{Name: "unsigned", Source: "oci://" + host + "/plugins/unsigned:v1", PublicKeys: []string{pub}}})
		if len(errs) != 1 || !errors.Is(errs[0], sources.ErrSignature) || !strings.Contains(errs[0].Error(), "no cosign signature") || !strings.Contains(errs[0].Error(), pub) {
			t.Fatalf("errs = %v", errs)
		}
		if _, err := os.Lstat(filepath.Join(m.LinkDir(), "unsigned.wasm")); err == nil {
			t.Error("an unsigned plugin was linked")
		}
		// insecure_skip_signature serves it, saying so.
		_, errs = m.Sync(ctx, []sources.Spec{{Name: "unsigned", Source: "oci://" + host + "/plugins/unsigned@" + d, InsecureSkipSignature: true}})
		if st, _ := m.Lookup("unsigned"); len(errs) > 0 || !strings.Contains(st.Verified, "skipped") {
			t.Errorf("skipped: %v %+v", errs, st)
		}
	})

	t.Run("another key", func(t *testing.T) {
		d := sourcestest.Push(t, host, "plugins/other", "v1", sources.MediaTypeWasm, fakeWasm(t))
		sourcestest.Sign(t, cosign, otherKey, host+"/plugins/other@"+d)
		m := newManager(t, nil)
		_, errs := m.Sync(ctx, []sources.Spec{{Name: "other", Source: "oci://" + host + "/plugins/other:v1", PublicKeys: []string{pub}}})
		if len(errs) != 1 || !errors.Is(errs[0], sources.ErrSignature) || !strings.Contains(errs[0].Error(), "none of the 1 signatures") || !strings.Contains(errs[0].Error(), pub) {
			t.Fatalf("errs = %v", errs)
		}
		// With the signer's key among those trusted, it verifies.
		if _, errs := m.Sync(ctx, []sources.Spec{{Name: "other", Source: "oci://" + host + "/plugins/other:v1", PublicKeys: []string{pub, otherPub}}}); len(errs) > 0 {
			t.Fatal(errs)
		}
	})

	t.Run("moved tag", func(t *testing.T) {
		v2 := fakeWasm(t)
		d2 := sourcestest.Push(t, host, "plugins/echo", "v1", sources.MediaTypeWasm, v2)
		// Not signed yet: refused, v1 goes on.
		changed, errs := m.Sync(ctx, []sources.Spec{spec})
		if changed || len(errs) != 1 || !errors.Is(errs[0], sources.ErrSignature) {
			t.Fatalf("unsigned move: changed %v, %v", changed, errs)
		}
		if st, _ := m.Lookup("echo"); !bytes.Equal(served(t, m, "echo"), v1) || st.Digest != d1 || st.Error == "" {
			t.Fatalf("after a refused move: %+v", st)
		}
		sourcestest.Sign(t, cosign, key, host+"/plugins/echo@"+d2)
		changed, errs = m.Sync(ctx, []sources.Spec{spec})
		if !changed || len(errs) > 0 {
			t.Fatalf("signed move: changed %v, %v", changed, errs)
		}
		if st, _ := m.Lookup("echo"); !bytes.Equal(served(t, m, "echo"), v2) || st.Digest != d2 || st.Error != "" {
			t.Fatalf("after the move: %+v", st)
		}
	})

	t.Run("tampered blob in the registry", func(t *testing.T) {
		w := fakeWasm(t)
		d := sourcestest.Push(t, host, "plugins/tampered", "v1", sources.MediaTypeWasm, w)
		sourcestest.Sign(t, cosign, key, host+"/plugins/tampered@"+d)
		blob := filepath.Join(storage, "docker", "registry", "v2", "blobs", "sha256", sha(w)[:2], sha(w), "data")
		bad := bytes.Clone(w)
		bad[len(bad)-1] ^= 0xff
		if err := os.WriteFile(blob, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		m := newManager(t, nil)
		_, errs := m.Sync(ctx, []sources.Spec{{Name: "tampered", Source: "oci://" + host + "/plugins/tampered:v1", PublicKeys: []string{pub}}})
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), "mismatch") {
			t.Fatalf("errs = %v", errs)
		}
	})

	t.Run("tampered store", func(t *testing.T) {
		m := newManager(t, nil)
		if _, errs := m.Sync(ctx, []sources.Spec{spec}); len(errs) > 0 {
			t.Fatal(errs)
		}
		path := filepath.Join(m.LinkDir(), "echo.wasm")
		target, _ := os.Readlink(path)
		good, _ := os.ReadFile(target)
		os.WriteFile(target, append(bytes.Clone(good), 0), 0o644)
		b, _ := os.ReadFile(path)
		if err := m.Check(path, b); err == nil || !strings.Contains(err.Error(), "changed on disk") {
			t.Fatalf("check of a changed store: %v", err)
		}
		// The next sync reports it (an error, a changed link so that it is
		// loaded again, the status) and fetches it again.
		changed, errs := m.Sync(ctx, []sources.Spec{spec})
		if len(errs) != 1 || !errors.Is(errs[0], sources.ErrStoreChanged) || !changed {
			t.Fatalf("sync of a changed store: changed %v, errs %v; want one ErrStoreChanged and a change", changed, errs)
		}
		if !bytes.Equal(served(t, m, "echo"), good) {
			t.Error("not fetched again")
		}
		if st, _ := m.Lookup("echo"); !strings.Contains(st.StoreChanged, "changed") || st.Error != "" {
			t.Errorf("status = %+v, want StoreChanged and no error", st)
		}
	})

	t.Run("pin", func(t *testing.T) {
		m := newManager(t, nil)
		pinned := spec
		pinned.SHA256 = strings.Repeat("0", 64)
		_, errs := m.Sync(ctx, []sources.Spec{pinned})
		if len(errs) != 1 || !errors.Is(errs[0], sources.ErrPin) {
			t.Fatalf("errs = %v", errs)
		}
	})
}

// TestHTTPS serves a pinned plugin from a TLS server; a wrong pin, no pin
// and a redirect to plain http off loopback are refused.
func TestHTTPS(t *testing.T) {
	w := fakeWasm(t)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/plugin.wasm":
			rw.Write(w)
		case "/away":
			http.Redirect(rw, r, "http://wasmtools.invalid/plugin.wasm", http.StatusFound)
		case "/same":
			http.Redirect(rw, r, "/plugin.wasm", http.StatusFound)
		case "/private":
			// Another host than the source's, on loopback: as a public
			// host bouncing the fetch to a private service would.
			_, port, _ := net.SplitHostPort(r.Host)
			http.Redirect(rw, r, "https://localhost:"+port+"/plugin.wasm", http.StatusFound)
		case "/metadata":
			http.Redirect(rw, r, "https://169.254.169.254/latest/meta-data/", http.StatusFound)
		default:
			http.NotFound(rw, r)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	m := newManager(t, srv.Client())
	tests := []struct {
		name string
		spec sources.Spec
		want string // error substring; "" to succeed
	}{
		{"pinned", sources.Spec{Source: srv.URL + "/plugin.wasm", SHA256: sha(w)}, ""},
		{"wrong pin", sources.Spec{Source: srv.URL + "/plugin.wasm", SHA256: sha([]byte("x"))}, "pin mismatch"},
		{"no pin", sources.Spec{Source: srv.URL + "/plugin.wasm"}, "needs a sha256 pin"},
		{"no pin, insecure", sources.Spec{Source: srv.URL + "/plugin.wasm", InsecureSkipSignature: true}, ""},
		{"redirect to http", sources.Spec{Source: srv.URL + "/away", InsecureSkipSignature: true}, "plain http only on loopback"},
		{"redirect on the same host", sources.Spec{Source: srv.URL + "/same", SHA256: sha(w)}, ""},
		{"redirect to a private host", sources.Spec{Source: srv.URL + "/private", SHA256: sha(w)}, "redirect to a private address refused: localhost:"},
		{"redirect to the metadata address", sources.Spec{Source: srv.URL + "/metadata", SHA256: sha(w)}, "redirect to a private address refused: 169.254.169.254:443"},
		{"too large", sources.Spec{Source: srv.URL + "/plugin.wasm", SHA256: sha(w), MaxSize: 8}, "over the size limit"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Name = fmt.Sprintf("p%d", i)
			_, errs := m.Sync(ctx, []sources.Spec{tt.spec})
			if tt.want == "" {
				if len(errs) > 0 {
					t.Fatal(errs)
				}
				if !bytes.Equal(served(t, m, tt.spec.Name), w) {
					t.Error("bytes differ")
				}
				return
			}
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.want) {
				t.Fatalf("errs = %v, want %q", errs, tt.want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	tests := []struct{ in, want, err string }{
		{"oci://ghcr.io/tuananh/time-plugin:latest", "oci://ghcr.io/tuananh/time-plugin:latest", ""},
		{"oci://ghcr.io/tuananh/time-plugin", "oci://ghcr.io/tuananh/time-plugin:latest", ""},
		{"oci://127.0.0.1:5000/a/b:v1", "oci://127.0.0.1:5000/a/b:v1", ""},
		{"oci://127.0.0.1:5000/a/b@sha256:" + strings.Repeat("a", 64), "oci://127.0.0.1:5000/a/b@sha256:" + strings.Repeat("a", 64), ""},
		{"oci://r/a@sha256:abc", "", "digest"},
		{"oci://ghcr.io", "", "want oci://"},
		{"https://example.com/p.wasm", "https://example.com/p.wasm", ""},
		{"http://example.com/p.wasm", "", "only on loopback"},
		{"http://127.0.0.1:8080/p.wasm", "http://127.0.0.1:8080/p.wasm", ""},
		{"file:///srv/p.wasm", "file:///srv/p.wasm", ""},
		{"file://relative/p.wasm", "", "file:///"},
		{"s3://bucket/p.wasm", "", "want oci://"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			r, err := sources.Parse(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || r.String() != tt.want {
				t.Fatalf("Parse = %v, %v; want %s", r, err, tt.want)
			}
		})
	}
}

// TestRegistryLogin: a registry that wants a login gets it from the
// Spec's credential (the configuration's [registries]) or from a Docker
// config file, and refuses a pull without one.
func TestRegistryLogin(t *testing.T) {
	host, _ := sourcestest.RegistryWithLogin(t, "bot", "s3cret")
	w := fakeWasm(t)
	sourcestest.PushWithLogin(t, host, "plugins/private", "v1", sources.MediaTypeWasm, w, auth.Credential{Username: "bot", Password: "s3cret"})
	ctx := context.Background()
	spec := sources.Spec{Name: "private", Source: "oci://" + host + "/plugins/private:v1", InsecureSkipSignature: true}

	if _, errs := newManager(t, nil).Sync(ctx, []sources.Spec{spec}); len(errs) != 1 || !strings.Contains(errs[0].Error(), "credential not found") {
		t.Fatalf("without a login: %v", errs)
	}
	withCred := spec
	withCred.Credential = &sources.Credential{Username: "bot", Password: "s3cret"}
	m := newManager(t, nil)
	if _, errs := m.Sync(ctx, []sources.Spec{withCred}); len(errs) > 0 {
		t.Fatalf("with the configuration's login: %v", errs)
	}
	if !bytes.Equal(served(t, m, "private"), w) {
		t.Error("bytes differ")
	}

	docker := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(docker, []byte(fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, base64.StdEncoding.EncodeToString([]byte("bot:s3cret")))), 0o600)
	m, err := sources.New(sources.Options{Dir: t.TempDir(), LinkDir: t.TempDir(), DockerConfig: docker})
	if err != nil {
		t.Fatal(err)
	}
	if _, errs := m.Sync(ctx, []sources.Spec{spec}); len(errs) > 0 {
		t.Fatalf("with the Docker config's login: %v", errs)
	}
}

// TestFileSource: a file:// source (hyper-mcp's local plugins) is a
// regular file only: /proc/self/environ (a "regular" file holding the
// server's environment), a symlink to it, /sys, a device and a FIFO are
// refused, and none reaches the store.
func TestFileSource(t *testing.T) {
	dir := t.TempDir()
	w := fakeWasm(t)
	good := filepath.Join(dir, "good.wasm")
	os.WriteFile(good, w, 0o644)
	link := filepath.Join(dir, "environ.wasm")
	os.Symlink("/proc/self/environ", link)
	fifo := filepath.Join(dir, "fifo.wasm")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	m := newManager(t, nil)
	for _, tt := range []struct{ name, path, want string }{
		{"regular", good, ""},
		{"proc", "/proc/self/environ", "under /proc"},
		{"symlink to proc", link, "under /proc"},
		{"sys", "/sys/kernel/mm/transparent_hugepage/enabled", "under /sys"},
		{"device", "/dev/zero", "under /dev"},
		{"fifo", fifo, "a FIFO"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, errs := m.Sync(context.Background(), []sources.Spec{{Name: tt.name, Source: "file://" + tt.path}})
			if tt.want == "" {
				if len(errs) > 0 || !bytes.Equal(served(t, m, tt.name), w) {
					t.Fatalf("errs = %v", errs)
				}
				return
			}
			if len(errs) != 1 || !errors.Is(errs[0], sources.ErrNotPluginFile) || !strings.Contains(errs[0].Error(), tt.want) {
				t.Fatalf("errs = %v, want ErrNotPluginFile naming %q", errs, tt.want)
			}
			if _, err := os.Lstat(filepath.Join(m.LinkDir(), tt.name+".wasm")); err == nil {
				t.Error("linked")
			}
		})
	}
}

// TestOCIBundle: cosign 3's signature format (a sigstore bundle as an OCI
// referrer) is verified natively beside the .sig tag: a bundle by the key
// serves, one by another key is refused naming the key, and both formats
// on one artifact serve.
func TestOCIBundle(t *testing.T) {
	cosign := sourcestest.Cosign(t)
	host, _ := sourcestest.Registry(t)
	dir := t.TempDir()
	key, pub := sourcestest.KeyPair(t, cosign, filepath.Join(dir, "a"))
	other, _ := sourcestest.KeyPair(t, cosign, filepath.Join(dir, "b"))
	ctx := context.Background()
	m := newManager(t, nil)
	w := fakeWasm(t)
	d := sourcestest.Push(t, host, "plugins/bundled", "v1", sources.MediaTypeWasm, w)
	sourcestest.SignBundle(t, cosign, key, host+"/plugins/bundled@"+d)
	spec := sources.Spec{Name: "bundled", Source: "oci://" + host + "/plugins/bundled:v1", PublicKeys: []string{pub}}
	if _, errs := m.Sync(ctx, []sources.Spec{spec}); len(errs) > 0 {
		t.Fatal(errs)
	}
	if !bytes.Equal(served(t, m, "bundled"), w) {
		t.Error("bytes differ")
	}
	if st, _ := m.Lookup("bundled"); !strings.Contains(st.Verified, "sigstore bundle") {
		t.Errorf("verified = %q, want the bundle named", st.Verified)
	}

	w2 := fakeWasm(t)
	d2 := sourcestest.Push(t, host, "plugins/otherbundle", "v1", sources.MediaTypeWasm, w2)
	sourcestest.SignBundle(t, cosign, other, host+"/plugins/otherbundle@"+d2)
	_, errs := m.Sync(ctx, []sources.Spec{{Name: "otherbundle", Source: "oci://" + host + "/plugins/otherbundle:v1", PublicKeys: []string{pub}}})
	if len(errs) != 1 || !errors.Is(errs[0], sources.ErrSignature) || !strings.Contains(errs[0].Error(), "none of the 1 signatures") || !strings.Contains(errs[0].Error(), pub) {
		t.Fatalf("another key's bundle: %v", errs)
	}

	w3 := fakeWasm(t)
	d3 := sourcestest.Push(t, host, "plugins/both", "v1", sources.MediaTypeWasm, w3)
	sourcestest.Sign(t, cosign, other, host+"/plugins/both@"+d3)
	sourcestest.SignBundle(t, cosign, key, host+"/plugins/both@"+d3)
	if _, errs := m.Sync(ctx, []sources.Spec{{Name: "both", Source: "oci://" + host + "/plugins/both:v1", PublicKeys: []string{pub}}}); len(errs) > 0 {
		t.Fatalf("a .sig by another key and a bundle by the key: %v", errs)
	}
}
