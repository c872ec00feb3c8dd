// Package sourcestest runs the real servers the sources tests need, on
// loopback: Debian's docker-registry (distribution v2.8), pushes to it with
// oras-go, and signs with cosign.
//
// A missing binary fails the test when the CI environment variable is set
// (.ci/run installs them: scripts/deps.sh), and skips it otherwise, saying
// how to install it.
package sourcestest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"go/build"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/crypto/bcrypt"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// Tool finds the binary name on PATH, or in candidates; if it is missing
// it fails the test under CI and skips it elsewhere, naming install.
func Tool(t testing.TB, name, install string, candidates ...string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, c := range candidates {
		if info, err := os.Stat(c); err == nil && !info.IsDir() {
			return c
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found (CI is set): %s", name, install)
	}
	t.Skipf("%s not found: %s (scripts/deps.sh does it)", name, install)
	return ""
}

// CosignInstall is how scripts/deps.sh installs cosign.
const CosignInstall = "scripts/install-cosign.sh"

// toolWait bounds the wait for a Go tool's build under way.
const toolWait = 20 * time.Minute

// Cosign returns the cosign binary (see [GoTool]).
func Cosign(t testing.TB) string {
	return GoTool(t, "cosign", CosignInstall)
}

// GoTool returns the Go tool name (cosign, ko): on PATH or in $GOPATH/bin
// (as `go env GOPATH` says, which may differ from the GOPATH variable).
// While scripts/install-go-tool.sh builds it (deps.sh runs it in the
// background), GoTool waits for the build, up to 20 minutes. install says
// how to install it when it is missing.
func GoTool(t testing.TB, name, install string) string {
	bins := []string{filepath.Join(build.Default.GOPATH, "bin")}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		bins = append(bins, filepath.Join(strings.TrimSpace(string(out)), "bin"))
	}
	var candidates []string
	for _, bin := range bins {
		waitForInstall(t, name, filepath.Join(bin, "."+name+"-install.lock"))
		candidates = append(candidates, filepath.Join(bin, name))
	}
	return Tool(t, name, install, candidates...)
}

// waitForInstall waits until no install of name holds the lock file at
// path (none there: no wait).
func waitForInstall(t testing.TB, name, path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	locked := make(chan error, 1)
	go func() { locked <- syscall.Flock(int(f.Fd()), syscall.LOCK_SH) }()
	select {
	case <-locked:
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	case <-time.After(toolWait):
		t.Fatalf("%s is still being built after %v (see %s)", name, toolWait, filepath.Join(filepath.Dir(path), name+"-install.log"))
	}
}

// Registry starts docker-registry on a free loopback port, with its
// storage in a temporary folder, waits until /v2/ answers 200, and stops
// it (by its process) when the test ends. It returns host:port and the
// storage folder.
func Registry(t testing.TB) (host, storage string) {
	t.Helper()
	return registry(t, "", "")
}

// RegistryWithLogin is Registry requiring a login (htpasswd, bcrypt):
// user and password.
func RegistryWithLogin(t testing.TB, user, password string) (host, storage string) {
	t.Helper()
	return registry(t, user, password)
}

func registry(t testing.TB, user, password string) (host, storage string) {
	t.Helper()
	bin := Tool(t, "docker-registry", "apt-get install docker-registry", "/usr/bin/docker-registry")
	dir := t.TempDir()
	storage = filepath.Join(dir, "storage")
	host = proxytest.FreeAddr(t) // the registry binds it next; a clash is reported as its exit below
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, storage, host)
	if user != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		os.WriteFile(htpasswd, []byte(user+":"+string(hash)+"\n"), 0o600)
		cfg += fmt.Sprintf("auth:\n  htpasswd:\n    realm: test\n    path: %s\n", htpasswd)
	}
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(bin, "serve", cfgPath)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("docker-registry exited: %v\n%s", err, logs.String())
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/v2/", nil)
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return host, storage
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("docker-registry not ready at %s: %v\n%s", host, err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Push pushes one layer of the given media type as an OCI artifact
// manifest to host/repo:tag with oras-go, and returns the manifest's
// digest ("sha256:…").
func Push(t testing.TB, host, repo, tag, mediaType string, layer []byte) string {
	t.Helper()
	return PushWithLogin(t, host, repo, tag, mediaType, layer, auth.EmptyCredential)
}

// PushWithLogin is Push with a login.
func PushWithLogin(t testing.TB, host, repo, tag, mediaType string, layer []byte, cred auth.Credential) string {
	t.Helper()
	ctx := context.Background()
	r, err := remote.NewRepository(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	r.PlainHTTP = true
	r.Client = &auth.Client{Credential: auth.StaticCredential(host, cred)}
	desc := content.NewDescriptorFromBytes(mediaType, layer)
	desc.Annotations = map[string]string{ocispec.AnnotationTitle: "plugin.wasm"}
	if err := r.Push(ctx, desc, bytes.NewReader(layer)); err != nil {
		t.Fatal(err)
	}
	opts := oras.PackManifestOptions{Layers: []ocispec.Descriptor{desc}}
	artifactType := "application/vnd.wasmtools.plugin.v1"
	if mediaType == ocispec.MediaTypeImageLayerGzip {
		// hyper-mcp's plugins are images FROM scratch: an image config.
		cfg := []byte(`{"architecture":"wasm","os":"wasip1","rootfs":{"type":"layers","diff_ids":[]}}`)
		cd := content.NewDescriptorFromBytes(ocispec.MediaTypeImageConfig, cfg)
		if err := r.Push(ctx, cd, bytes.NewReader(cfg)); err != nil {
			t.Fatal(err)
		}
		opts.ConfigDescriptor = &cd
		artifactType = ""
	}
	man, err := oras.PackManifest(ctx, r, oras.PackManifestVersion1_1, artifactType, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Tag(ctx, man, tag); err != nil {
		t.Fatal(err)
	}
	return man.Digest.String()
}

// Tarball is hyper-mcp's plugin layer: a gzipped tar holding plugin.wasm.
func Tarball(t testing.TB, wasm []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "README", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi"))
	tw.WriteHeader(&tar.Header{Name: "plugin.wasm", Mode: 0o644, Size: int64(len(wasm)), Typeflag: tar.TypeReg})
	tw.Write(wasm)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// KeyPair makes a cosign key pair in dir (password "test") and returns the
// private and public key files.
func KeyPair(t testing.TB, cosign, dir string) (key, pub string) {
	t.Helper()
	run(t, cosign, dir, "generate-key-pair")
	return filepath.Join(dir, "cosign.key"), filepath.Join(dir, "cosign.pub")
}

// Sign signs host/repo@digest with key, with no transparency log, over
// plain HTTP (the registry is on loopback).
func Sign(t testing.TB, cosign, key, ref string) {
	t.Helper()
	run(t, cosign, filepath.Dir(key), "sign", "--key", key, "--tlog-upload=false", "--allow-http-registry", "--allow-insecure-registry", "--yes", ref)
}

// SignBundle signs host/repo@digest with key in cosign 3's format: a
// sigstore bundle attached as an OCI referrer (--new-bundle-format; with
// a registry without the referrers API, the sha256-HEX tag index), with
// no transparency log.
func SignBundle(t testing.TB, cosign, key, ref string) {
	t.Helper()
	run(t, cosign, filepath.Dir(key), "sign", "--key", key, "--tlog-upload=false", "--new-bundle-format", "--allow-http-registry", "--allow-insecure-registry", "--yes", ref)
}

func run(t testing.TB, cosign, dir string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cosign, args...)
	cmd.Dir = dir
	home := filepath.Join(dir, ".home")
	os.MkdirAll(home, 0o755)
	// No network but loopback: no TUF, no Rekor, no Fulcio.
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=test", "HOME="+home, "TUF_ROOT="+filepath.Join(home, "tuf"), "COSIGN_EXPERIMENTAL=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cosign %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
