// Package imagetest builds wasmtools' container image the way
// docs/DEPLOY.md tells an operator to (ko, from .ko.yaml, no Docker
// daemon), pushes it to a real registry on loopback, signs it with cosign,
// and runs the binary it holds.
package imagetest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/sources/sourcestest"
)

// koInstall is how scripts/deps.sh installs ko.
const koInstall = "scripts/install-go-tool.sh ko github.com/google/ko@v0.18.0"

// root is the repository's root, where .ko.yaml is.
const root = "../.."

func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image: not in -short")
	}
	ko := sourcestest.GoTool(t, "ko", koInstall)
	cosign := sourcestest.Cosign(t)
	host, _ := sourcestest.Registry(t)
	ctx := context.Background()

	// The base: what .ko.yaml's default base (a static distroless image,
	// not reachable from here) holds, made on the loopback registry.
	base := host + "/base:v1"
	pushBase(t, ctx, base)

	repo := host + "/wasmtools"
	// Both builds share one Go build cache, fresh for this test, and the
	// module cache of the go running the test (ko's HOME is a temporary
	// folder, which would give each build an empty module cache and build
	// cache: two full compiles, about 140 s each on 2 cores). So the second
	// build checks what ko adds (layers, config, manifest, no time stamped)
	// and the link; two cold compiles of the same tree give the same
	// binary (checked by hand, Go 1.26: byte for byte).
	gocache := t.TempDir()
	ref := koBuild(t, ko, base, repo, gocache)
	// Reproducible: the same tree builds the same image, byte for byte.
	if again := koBuild(t, ko, base, repo, gocache); again != ref {
		t.Errorf("a second build of the same tree gave another image: %s, then %s", ref, again)
	}
	t.Logf("image %s", ref)

	// Signed as wasmtools requires of plugins: cosign, a key pair, no
	// transparency log on loopback.
	dir := t.TempDir()
	key, pub := sourcestest.KeyPair(t, cosign, dir)
	sourcestest.Sign(t, cosign, key, ref)
	verify := exec.Command(cosign, "verify", "--key", pub, "--insecure-ignore-tlog", "--allow-http-registry", "--allow-insecure-registry", ref)
	verify.Env = append(os.Environ(), "HOME="+filepath.Join(dir, ".home"), "TUF_ROOT="+filepath.Join(dir, ".home", "tuf"))
	if out, err := verify.CombinedOutput(); err != nil {
		t.Fatalf("cosign verify %s: %v\n%s", ref, err, out)
	}

	bin := extractEntrypoint(t, ctx, ref)

	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("the image's wasmtools version: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`^(devel|v\S+|[0-9a-f]{12}(-dirty)?)\n$`).Match(out) {
		t.Errorf("the image's wasmtools version printed %q", out)
	}

	serve(t, bin)
}

// pushBase pushes a one-layer linux/amd64 image to ref: CA certificates, a
// non-root user (65532, as distroless images have) and /tmp.
func pushBase(t *testing.T, ctx context.Context, ref string) {
	t.Helper()
	var files = []struct {
		name string
		mode int64
		body []byte
	}{
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{"etc/group", 0o644, []byte("root:x:0:\nnonroot:x:65532:\n")},
	}
	if certs, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt"); err == nil {
		files = append(files, struct {
			name string
			mode int64
			body []byte
		}{"etc/ssl/certs/ca-certificates.crt", 0o644, certs})
	}
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	epoch := time.Unix(0, 0)
	for _, d := range []string{"etc/", "etc/ssl/", "etc/ssl/certs/", "home/", "home/nonroot/", "tmp/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		tw.WriteHeader(&tar.Header{Name: d, Mode: mode, Typeflag: tar.TypeDir, ModTime: epoch})
	}
	for _, f := range files {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.body)), Typeflag: tar.TypeReg, ModTime: epoch})
		tw.Write(f.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	zw.Close()

	cfg, _ := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config:   ocispec.ImageConfig{User: "65532", Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(raw.Bytes())}},
	})
	r := repository(t, ref)
	layer := content.NewDescriptorFromBytes(ocispec.MediaTypeImageLayerGzip, gz.Bytes())
	config := content.NewDescriptorFromBytes(ocispec.MediaTypeImageConfig, cfg)
	for _, b := range []struct {
		d    ocispec.Descriptor
		body []byte
	}{{layer, gz.Bytes()}, {config, cfg}} {
		if err := r.Push(ctx, b.d, bytes.NewReader(b.body)); err != nil {
			t.Fatal(err)
		}
	}
	man, err := oras.PackManifest(ctx, r, oras.PackManifestVersion1_1, "", oras.PackManifestOptions{
		Layers: []ocispec.Descriptor{layer}, ConfigDescriptor: &config,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Tag(ctx, man, tagOf(ref)); err != nil {
		t.Fatal(err)
	}
}

// koBuild runs DEPLOY.md's build command with the loopback base and
// returns the image reference ko prints (REPO@sha256:…).
func koBuild(t *testing.T, ko, base, repo, gocache string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, ko, "build", "--bare", "--platform=linux/amd64", "--sbom=none", "./cmd/wasmtools")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "KO_DOCKER_REPO="+repo, "KO_DEFAULTBASEIMAGE="+base, "HOME="+t.TempDir(),
		"GOCACHE="+gocache, "GOMODCACHE="+goEnv(t, "GOMODCACHE"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ko build: %v\n%s", err, stderr.String())
	}
	ref := strings.TrimSpace(string(out))
	if !strings.HasPrefix(ref, repo+"@sha256:") {
		t.Fatalf("ko build printed %q, not %s@sha256:…\n%s", ref, repo, stderr.String())
	}
	return ref
}

// extractEntrypoint writes the file the image's entrypoint names, from the
// image's layers, into a temporary folder and returns its path.
func extractEntrypoint(t *testing.T, ctx context.Context, ref string) string {
	t.Helper()
	r := repository(t, ref)
	_, manBytes, err := oras.FetchBytes(ctx, r, ref[strings.LastIndex(ref, "@")+1:], oras.DefaultFetchBytesOptions)
	if err != nil {
		t.Fatal(err)
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(manBytes, &man); err != nil {
		t.Fatal(err)
	}
	cfgBytes, err := content.FetchAll(ctx, r, man.Config)
	if err != nil {
		t.Fatal(err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(cfgBytes, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Config.Entrypoint) == 0 {
		t.Fatalf("the image has no entrypoint: %s", cfgBytes)
	}
	want := strings.TrimPrefix(cfg.Config.Entrypoint[0], "/")
	if cfg.Config.User == "" || cfg.Config.User == "0" || cfg.Config.User == "root" {
		t.Errorf("the image runs as %q, not a non-root user", cfg.Config.User)
	}
	bin := filepath.Join(t.TempDir(), "wasmtools")
	found := false
	// A later layer's file replaces an earlier one's: read them all.
	for _, l := range man.Layers {
		rc, err := r.Fetch(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(rc)
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimPrefix(h.Name, "/") != want || h.Typeflag != tar.TypeReg {
				continue
			}
			f, err := os.OpenFile(bin, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
			found = true
		}
		rc.Close()
	}
	if !found {
		t.Fatalf("no %s in the image's layers", want)
	}
	return bin
}

// serve runs the image's binary as an HTTP server of the example plugins
// and calls one through a go-sdk client.
func serve(t *testing.T, bin string) {
	t.Helper()
	plugins, err := filepath.Abs(filepath.Join(root, "examples/plugins/dist"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(plugins, "hash.wasm")); err != nil {
		t.Fatalf("the example plugins are not built (make plugins): %v", err)
	}
	addr := proxytest.FreeAddr(t)
	cmd := exec.Command(bin, "serve", "--http", addr, "--cache-dir", "", plugins)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var logs bytes.Buffer
	ready := make(chan struct{}, 1)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "listening") || strings.Contains(sc.Text(), "serving") {
				select {
				case ready <- struct{}{}:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// Ready when /readyz says so; the log line is the wake-up, a
	// one-second backstop covers a line worded otherwise.
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the image's wasmtools is not ready at %s: %v\n%s", addr, err, logs.String())
		}
		select {
		case <-ready:
		case <-exited:
			t.Fatalf("the image's wasmtools exited:\n%s", logs.String())
		case <-time.After(time.Second):
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "imagetest", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "hash", Arguments: map[string]any{"text": "abc"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || len(res.Content) == 0 {
		t.Fatalf("hash through the image's wasmtools: %+v", res)
	}
	text := fmt.Sprint(res.Content[0].(*mcp.TextContent).Text)
	if !strings.Contains(text, "ba7816bf") { // sha256("abc")
		t.Errorf("hash through the image's wasmtools answered %q", text)
	}
}

func repository(t *testing.T, ref string) *remote.Repository {
	t.Helper()
	name := ref
	if i := strings.LastIndex(name, "@"); i >= 0 {
		name = name[:i]
	} else if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	r, err := remote.NewRepository(name)
	if err != nil {
		t.Fatal(err)
	}
	r.PlainHTTP = true
	return r
}

func tagOf(ref string) string { return ref[strings.LastIndex(ref, ":")+1:] }

// goEnv is the go command's setting name, as the go running the test sees
// it.
func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}
