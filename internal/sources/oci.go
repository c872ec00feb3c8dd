package sources

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
)

// Media types of a plugin's layer.
const (
	// MediaTypeWasm is a plain Wasm OCI artifact's layer (oras push
	// plugin.wasm:application/wasm, wkg, wassette).
	MediaTypeWasm = "application/wasm"
	// MediaTypeWasmLayer is the CNCF Wasm OCI artifact layer.
	MediaTypeWasmLayer = "application/vnd.wasm.content.layer.v1+wasm"
	// hyper-mcp publishes its plugins as images FROM scratch with
	// /plugin.wasm: a gzipped tar layer, OCI or Docker.
	mediaTypeTarGzip       = ocispec.MediaTypeImageLayerGzip
	mediaTypeDockerTarGzip = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	mediaTypeTar           = ocispec.MediaTypeImageLayer

	mediaTypeDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
	mediaTypeDockerList     = "application/vnd.docker.distribution.manifest.list.v2+json"
)

// maxManifest bounds a manifest or index, maxLayers the layers looked at.
const (
	maxManifest = 4 << 20
	maxLayers   = 64
)

type ociFetch struct {
	m    *Manager
	spec Spec
	ref  Ref
	repo *remote.Repository
	desc ocispec.Descriptor // the resolved manifest or index
}

func (o *ociFetch) repository() (*remote.Repository, error) {
	if o.repo != nil {
		return o.repo, nil
	}
	repo, err := remote.NewRepository(o.ref.Registry + "/" + o.ref.Repository)
	if err != nil {
		return nil, err
	}
	repo.PlainHTTP = isLoopback(o.ref.Registry)
	repo.MaxMetadataBytes = maxManifest
	repo.TagListMaxPages, repo.ReferrerListMaxPages = 1, 1
	client := &auth.Client{Client: o.m.client, Cache: auth.NewCache(), ClientID: "wasmtools"}
	client.SetUserAgent("wasmtools")
	switch c := o.spec.Credential; {
	case c != nil && c.Token != "":
		client.Credential = auth.StaticCredential(o.ref.Registry, auth.Credential{AccessToken: c.Token})
	case c != nil:
		client.Credential = auth.StaticCredential(o.ref.Registry, auth.Credential{Username: c.Username, Password: c.Password})
	case o.m.opts.DockerConfig != "-":
		var store credentials.Store
		var err error
		if o.m.opts.DockerConfig != "" {
			store, err = credentials.NewStore(o.m.opts.DockerConfig, credentials.StoreOptions{})
		} else {
			store, err = credentials.NewStoreFromDocker(credentials.StoreOptions{})
		}
		if err != nil {
			return nil, fmt.Errorf("docker config: %w", err)
		}
		client.Credential = credentials.Credential(store)
	}
	repo.Client = client
	o.repo = repo
	return repo, nil
}

// resolve resolves the tag (or checks the digest) to the manifest's
// descriptor, and returns its digest.
func (o *ociFetch) resolve(ctx context.Context) (string, error) {
	o.m.progress(Event{Name: o.spec.Name, Stage: "resolve"})
	repo, err := o.repository()
	if err != nil {
		return "", err
	}
	reference := o.ref.Tag
	if o.ref.Digest != "" {
		reference = o.ref.Digest
	}
	sctx, cancel := o.m.stage(ctx)
	defer cancel()
	desc, err := repo.Resolve(sctx, reference)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", reference, o.m.stageErr(sctx, ctx, err))
	}
	if o.ref.Digest != "" && desc.Digest.String() != o.ref.Digest {
		return "", fmt.Errorf("resolve %s: the registry answered %s", o.ref.Digest, desc.Digest)
	}
	if desc.Size > maxManifest {
		return "", fmt.Errorf("manifest %s: %d bytes: %w of %d bytes for a manifest", desc.Digest, desc.Size, ErrTooLarge, maxManifest)
	}
	o.desc = desc
	return desc.Digest.String(), nil
}

// fetchSmall reads a manifest, index or signature payload, verified
// against desc (size and digest), at most max bytes.
func (o *ociFetch) fetchSmall(ctx context.Context, desc ocispec.Descriptor, max int64) ([]byte, error) {
	if desc.Size > max || desc.Size < 0 {
		return nil, fmt.Errorf("%s: %d bytes: %w of %d", desc.Digest, desc.Size, ErrTooLarge, max)
	}
	rc, err := o.repo.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := content.ReadAll(rc, desc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", desc.Digest, err)
	}
	return b, nil
}

// pull verifies the signature of the resolved manifest (unless skipped),
// then reads the manifest and the plugin's layer, each verified against
// its digest, and returns the plugin's bytes and what vouched for them.
func (o *ociFetch) pull(ctx context.Context) ([]byte, string, error) {
	verified := "skipped (insecure_skip_signature)"
	if !o.spec.InsecureSkipSignature {
		o.m.progress(Event{Name: o.spec.Name, Stage: "verify"})
		sctx, cancel := o.m.stage(ctx)
		by, err := o.verify(sctx)
		err = o.m.stageErr(sctx, ctx, err)
		cancel()
		if err != nil {
			return nil, "", err
		}
		verified = by
	}
	sctx, cancel := o.m.stage(ctx)
	defer cancel()
	mb, err := o.fetchSmall(sctx, o.desc, maxManifest)
	if err != nil {
		return nil, "", fmt.Errorf("manifest: %w", o.m.stageErr(sctx, ctx, err))
	}
	man, err := o.manifest(sctx, o.desc.MediaType, mb, 0)
	if err != nil {
		return nil, "", o.m.stageErr(sctx, ctx, err)
	}
	o.m.progress(Event{Name: o.spec.Name, Stage: "download"})
	layer, err := pluginLayer(man)
	if err != nil {
		return nil, "", err
	}
	if layer.Size < 0 || uint64(layer.Size) > o.spec.MaxSize {
		return nil, "", fmt.Errorf("layer %s: %d bytes: %w (max_module_size = %d)", layer.Digest, layer.Size, ErrTooLarge, o.spec.MaxSize)
	}
	rc, err := o.repo.Fetch(ctx, layer)
	if err != nil {
		return nil, "", fmt.Errorf("layer %s: %w", layer.Digest, err)
	}
	defer rc.Close()
	pr := &progressReader{r: rc, m: o.m, name: o.spec.Name, total: layer.Size, start: time.Now()}
	b, err := content.ReadAll(pr, layer)
	if err != nil {
		return nil, "", fmt.Errorf("layer %s: %w", layer.Digest, err)
	}
	o.m.progress(Event{Name: o.spec.Name, Stage: "done", Done: int64(len(b)), Total: layer.Size, Elapsed: time.Since(pr.start)})
	switch layer.MediaType {
	case MediaTypeWasm, MediaTypeWasmLayer:
		return b, verified, nil
	}
	wasm, err := extractPlugin(b, layer.MediaType != mediaTypeTar, o.spec.MaxSize)
	if err != nil {
		return nil, "", fmt.Errorf("layer %s: %w", layer.Digest, err)
	}
	return wasm, verified, nil
}

// manifest parses an image manifest; an index is followed to the one
// manifest it lists for Wasm (platform wasip1, wasi or wasm), else its
// only manifest that is not an attestation.
func (o *ociFetch) manifest(ctx context.Context, mediaType string, b []byte, depth int) (ocispec.Manifest, error) {
	var probe struct {
		MediaType string               `json:"mediaType"`
		Manifests []ocispec.Descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return ocispec.Manifest{}, fmt.Errorf("manifest: %w", err)
	}
	if mediaType == ocispec.MediaTypeImageIndex || mediaType == mediaTypeDockerList || probe.MediaType == ocispec.MediaTypeImageIndex {
		if depth > 0 {
			return ocispec.Manifest{}, fmt.Errorf("index %s: lists another index: one level is followed", o.desc.Digest)
		}
		var pick []ocispec.Descriptor
		for _, d := range probe.Manifests {
			if p := d.Platform; p != nil && (p.OS == "wasip1" || p.OS == "wasi" || p.Architecture == "wasm") {
				pick = []ocispec.Descriptor{d}
				break
			}
			if p := d.Platform; p == nil || p.OS != "unknown" {
				pick = append(pick, d)
			}
		}
		if len(pick) != 1 {
			return ocispec.Manifest{}, fmt.Errorf("index %s: lists %d manifests, none of them for Wasm (platform wasip1, wasi or wasm)", o.desc.Digest, len(probe.Manifests))
		}
		mb, err := o.fetchSmall(ctx, pick[0], maxManifest)
		if err != nil {
			return ocispec.Manifest{}, fmt.Errorf("manifest: %w", err)
		}
		return o.manifest(ctx, pick[0].MediaType, mb, depth+1)
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(b, &man); err != nil {
		return ocispec.Manifest{}, fmt.Errorf("manifest: %w", err)
	}
	return man, nil
}

// pluginLayer picks the plugin's layer: a Wasm layer, else one gzipped
// (or plain) tar layer, as hyper-mcp publishes.
func pluginLayer(man ocispec.Manifest) (ocispec.Descriptor, error) {
	if len(man.Layers) > maxLayers {
		return ocispec.Descriptor{}, fmt.Errorf("manifest: %d layers, more than %d", len(man.Layers), maxLayers)
	}
	var tars []ocispec.Descriptor
	var seen []string
	for _, l := range man.Layers {
		switch l.MediaType {
		case MediaTypeWasm, MediaTypeWasmLayer:
			return l, nil
		case mediaTypeTarGzip, mediaTypeDockerTarGzip, mediaTypeTar:
			tars = append(tars, l)
		}
		seen = append(seen, l.MediaType)
	}
	if len(tars) == 1 {
		return tars[0], nil
	}
	if len(tars) > 1 {
		return tars[len(tars)-1], nil // the top layer of an image: where COPY plugin.wasm lands
	}
	return ocispec.Descriptor{}, fmt.Errorf("manifest: no plugin layer (want %s, %s or a tar+gzip layer holding plugin.wasm; found %s)", MediaTypeWasm, MediaTypeWasmLayer, strings.Join(seen, ", "))
}

// extractPlugin finds plugin.wasm (in any folder) in a tar, gzipped or
// not, reading at most 2×max+1 MiB of tar in all and max of the file.
func extractPlugin(b []byte, gzipped bool, max uint64) ([]byte, error) {
	var r io.Reader = strings.NewReader(string(b))
	if gzipped {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		r = zr
	}
	budget := int64(min(2*max+1<<20, 1<<40))
	tr := tar.NewReader(io.LimitReader(r, budget))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, errors.New("no plugin.wasm in the layer")
		}
		if err != nil {
			return nil, fmt.Errorf("tar: %w (a layer may decompress to at most %d bytes)", err, budget)
		}
		if path.Base(h.Name) != "plugin.wasm" || h.Typeflag != tar.TypeReg {
			continue
		}
		if h.Size < 0 || uint64(h.Size) > max {
			return nil, fmt.Errorf("plugin.wasm: %d bytes: %w (max_module_size = %d)", h.Size, ErrTooLarge, max)
		}
		wasm, err := io.ReadAll(io.LimitReader(tr, h.Size))
		if err != nil || int64(len(wasm)) != h.Size {
			return nil, fmt.Errorf("plugin.wasm: short read: %v", err)
		}
		return wasm, nil
	}
}

// progressReader tells the manager's Progress how a download goes.
type progressReader struct {
	r     io.Reader
	m     *Manager
	name  string
	done  int64
	total int64
	start time.Time
	last  time.Time
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	if now := time.Now(); now.Sub(p.last) >= 100*time.Millisecond || err != nil {
		p.last = now
		p.m.progress(Event{Name: p.name, Stage: "download", Done: p.done, Total: p.total, Elapsed: now.Sub(p.start)})
	}
	return n, err
}

func (m *Manager) progress(ev Event) {
	if ev.Stage != "done" {
		m.mu.Lock()
		if e := m.ents[ev.Name]; e != nil && e.status.Stage != ev.Stage {
			e.status.Stage, e.status.StageSince = ev.Stage, time.Now()
		}
		m.mu.Unlock()
	}
	if m.opts.Progress != nil {
		m.opts.Progress(ev)
	}
}

// ErrStageTimeout: one stage of a fetch before the download took longer
// than Options.StageTimeout (a stalled or trickling registry).
var ErrStageTimeout = errors.New("stage timed out")

// stage bounds one stage of a fetch by Options.StageTimeout.
func (m *Manager) stage(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, m.opts.StageTimeout)
}

// stageErr names a stage's own timeout (sctx expired, ctx not) as
// ErrStageTimeout.
func (m *Manager) stageErr(sctx, ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(sctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("%w after %v (stage_timeout): %v", ErrStageTimeout, m.opts.StageTimeout, err)
	}
	return err
}

// safeClient copies c (or a default client) with a redirect policy that
// refuses plain HTTP off loopback and more than 5 hops, and whose dials
// hold each redirect hop to the private-address rule (redirect.go).
//
// The default client's waits (a dial, a TLS handshake, response
// headers) bound the download, which no stage bound covers; each is
// longer than stage, the stages' bound, so that a stage that stalls is
// ended by stage_timeout, saying so, and not by the transport first: at
// 30 s both, a stalled stage's error was either (TestServeOffline failed
// 3 runs in 5 on a loaded machine), and a stage_timeout over 30 s did
// not hold.
func safeClient(c *http.Client, stage time.Duration) *http.Client {
	var out http.Client
	if c != nil {
		out = *c
	} else {
		wait := max(30*time.Second, stage+10*time.Second)
		d := &net.Dialer{Timeout: wait}
		out.Transport = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           d.DialContext,
			TLSHandshakeTimeout:   wait,
			ResponseHeaderTimeout: wait,
			IdleConnTimeout:       90 * time.Second,
			MaxIdleConnsPerHost:   4,
		}
	}
	out.Transport = guardTransport(out.Transport)
	out.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return errors.New("more than 5 redirects")
		}
		if req.URL.Scheme != "https" && !(req.URL.Scheme == "http" && isLoopback(req.URL.Host)) {
			return fmt.Errorf("redirect to %s refused: plain http only on loopback", req.URL.Redacted())
		}
		redirected(req.Context(), req.URL)
		return nil
	}
	return &out
}
