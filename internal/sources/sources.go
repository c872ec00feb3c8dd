// Package sources fetches plugins named by a remote source, an OCI
// artifact (oci://REGISTRY/REPO:TAG or @sha256:DIGEST) or an HTTPS URL,
// into a content-addressed store, and says which verified bytes each
// plugin name stands for.
//
// What is verified, and when:
//
//   - An OCI artifact's cosign signature, against the operator's public
//     key, before its layers are downloaded (on by default; a plugin's
//     InsecureSkipSignature turns it off, logged as a warning each time).
//   - Every source's bytes against the operator's sha256 pin, if any. An
//     HTTPS source needs a pin unless InsecureSkipSignature is set: TLS
//     says who served the bytes, not that they are the ones meant.
//   - Every OCI manifest and blob against its digest, as it is read.
//   - The stored bytes against their digest on every load ([Manager.Check],
//     the reloader's check hook), not only on download.
//
// A [Manager] keeps a folder of links, NAME.wasm to the stored blob, that a
// plugins.Reloader serves like any plugin folder: a new version (a moved
// tag) is fetched and verified beside the one served, and only then is its
// link swapped, so the reloader's ordinary swap serves it once it has
// compiled, and a failure at any step leaves the old version serving.
//
// Network and size bounds: a fetch runs under [Options.Timeout]; manifests
// are bounded to 4 MiB and signature payloads to 64 KiB; a plugin's bytes
// (and, for a tarball, what it decompresses to) to the plugin's module
// size limit. Plain HTTP is used only for loopback hosts, and a redirect
// to plain HTTP elsewhere is refused.
package sources

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/wasmtools/wasmtools/internal/telemetry"
)

// DefaultMaxSize bounds a plugin's bytes when its Spec sets no MaxSize:
// the sandbox's default module size limit.
const DefaultMaxSize = 64 << 20

// DefaultTimeout bounds one source's fetch when Options.Timeout is 0.
const DefaultTimeout = 5 * time.Minute

// DefaultStageTimeout bounds each stage of a fetch before the download
// (resolving a tag, verifying a signature, reading a manifest) when
// Options.StageTimeout is 0: a registry that stalls or trickles is given
// up on after it, and the download is bounded by Options.Timeout.
const DefaultStageTimeout = 30 * time.Second

// Errors callers branch on.
var (
	// ErrSignature: an OCI artifact has no signature that verifies with
	// the configured key (none at all, or only others').
	ErrSignature = errors.New("signature not verified")
	// ErrPin: the bytes do not match the configured sha256 pin.
	ErrPin = errors.New("sha256 pin mismatch")
	// ErrTooLarge: the source offered more than the plugin's size limit.
	ErrTooLarge = errors.New("over the size limit")
)

// IsRemote reports whether s names a remote source rather than a local
// path: oci://, https:// or http://.
func IsRemote(s string) bool {
	for _, p := range []string{"oci://", "https://", "http://"} {
		if strings.HasPrefix(strings.ToLower(s), p) {
			return true
		}
	}
	return false
}

// Ref is a parsed source.
type Ref struct {
	// OCI: Registry is host[:port], Repository the path, and one of Tag
	// or Digest ("sha256:…") is set.
	Registry, Repository, Tag, Digest string
	// URL is an HTTPS (or loopback HTTP) source; nil for OCI.
	URL *url.URL
	// File is a file:// source's absolute path (hyper-mcp's local
	// plugins): its bytes are copied into the store like any others.
	File string
}

// String gives the source back in its canonical form.
func (r Ref) String() string {
	if r.File != "" {
		return "file://" + r.File
	}
	if r.URL != nil {
		return r.URL.String()
	}
	if r.Digest != "" {
		return "oci://" + r.Registry + "/" + r.Repository + "@" + r.Digest
	}
	return "oci://" + r.Registry + "/" + r.Repository + ":" + r.Tag
}

var hexSHA = func(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// Parse parses a remote source. An OCI reference without a tag or digest
// means the tag "latest", as docker and hyper-mcp read it. An http:// URL
// is accepted only for a loopback host.
func Parse(s string) (Ref, error) {
	switch {
	case strings.HasPrefix(s, "oci://"):
		rest := strings.TrimPrefix(s, "oci://")
		reg, repo, ok := strings.Cut(rest, "/")
		if !ok || reg == "" || repo == "" {
			return Ref{}, fmt.Errorf("source %q: want oci://REGISTRY/REPOSITORY:TAG or @sha256:DIGEST", s)
		}
		r := Ref{Registry: reg}
		if name, digest, ok := strings.Cut(repo, "@"); ok {
			if !strings.HasPrefix(digest, "sha256:") || !hexSHA(strings.TrimPrefix(digest, "sha256:")) {
				return Ref{}, fmt.Errorf("source %q: a digest is sha256: and 64 lower-case hex digits", s)
			}
			r.Repository, r.Digest = name, digest
		} else if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
			r.Repository, r.Tag = repo[:i], repo[i+1:]
		} else {
			r.Repository, r.Tag = repo, "latest"
		}
		if r.Repository == "" || r.Repository != strings.ToLower(r.Repository) || (r.Digest == "" && r.Tag == "") {
			return Ref{}, fmt.Errorf("source %q: want a lower-case repository and a tag or digest", s)
		}
		return r, nil
	case strings.HasPrefix(s, "https://"), strings.HasPrefix(s, "http://"):
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return Ref{}, fmt.Errorf("source %q: not a URL", s)
		}
		if u.Scheme == "http" && !isLoopback(u.Host) {
			return Ref{}, fmt.Errorf("source %q: plain http only on loopback (127.0.0.1, ::1, localhost); use https", s)
		}
		return Ref{URL: u}, nil
	case strings.HasPrefix(s, "file://"):
		u, err := url.Parse(s)
		if err != nil || (u.Host != "" && u.Host != "localhost") || !filepath.IsAbs(u.Path) {
			return Ref{}, fmt.Errorf("source %q: want file:///ABSOLUTE/PATH", s)
		}
		return Ref{File: filepath.Clean(u.Path)}, nil
	}
	return Ref{}, fmt.Errorf("source %q: want oci://, https:// (or http:// on loopback) or file://", s)
}

// isLoopback reports whether host (with or without a port) is a loopback
// name or address.
func isLoopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Spec is one remote plugin the operator asked for.
type Spec struct {
	// Name is the plugin's name: its link is NAME.wasm.
	Name string
	// Source is oci://… or https://… (see [Parse]).
	Source string
	// SHA256, if set, is the pin on the plugin's bytes (64 hex digits).
	SHA256 string
	// PublicKeys are PEM files of the keys an OCI artifact's signature may
	// be made with; one that verifies is enough.
	PublicKeys []string
	// InsecureSkipSignature serves an OCI artifact without a verified
	// signature, and an HTTPS source without a pin. Logged as a warning
	// on every fetch.
	InsecureSkipSignature bool
	// Credential, if set, logs in to the source's registry (OCI) or is
	// sent to the HTTPS server; else the Docker config file is asked
	// (OCI only).
	Credential *Credential
	// MaxSize bounds the plugin's bytes; 0 means [DefaultMaxSize].
	MaxSize uint64
}

// Credential is a registry or server login: a user name and password, or
// a bearer token.
type Credential struct {
	Username, Password, Token string
}

// Event is a step of a fetch, for progress displays.
type Event struct {
	Name string
	// Stage is "resolve", "verify", "download" or "done".
	Stage string
	// Done and Total count the bytes of a download (Total -1 when not
	// known).
	Done, Total int64
	Elapsed     time.Duration
}

// Options configures a [Manager].
type Options struct {
	// Dir is the content-addressed store: Dir/blobs/sha256/HEX. It may
	// be shared between processes. A version no longer linked is removed
	// unless a registered link folder (Dir/links) or a record (Dir/index)
	// names it; none is when this manager's link folder cannot be
	// registered (a read-only store), nor while a live registration's
	// folder cannot be seen from this process (another container or file
	// system view sharing the store). Every Sync also removes what no
	// link or record names and is older than a day (kept while removal
	// was off, fetched and never linked, left half written by a crash),
	// and the records of settings none of its sources has that no
	// manager sharing the store renewed for a month.
	// A registration is renewed on every Sync and by KeepRegistered,
	// removed by Close, and taken for ended when unrenewed for a week.
	Dir string
	// LinkDir is the folder of NAME.wasm links this manager keeps, to be
	// served by a plugins.Reloader. It is this manager's alone.
	LinkDir string
	// Logger receives fetch messages; nil discards them.
	Logger *slog.Logger
	// Client makes the requests; nil means a client with connect, TLS
	// and header timeouts of 30s. Its CheckRedirect is replaced by one
	// that refuses redirects to plain HTTP off loopback.
	Client *http.Client
	// Timeout bounds one source's whole fetch; 0 means [DefaultTimeout].
	Timeout time.Duration
	// StageTimeout bounds each stage before the download (resolve,
	// verify, manifest); 0 means [DefaultStageTimeout].
	StageTimeout time.Duration
	// DockerConfig is the Docker config file whose logins are used for
	// OCI registries without a Spec.Credential: "" means the default
	// ($DOCKER_CONFIG/config.json, else ~/.docker/config.json), "-"
	// none.
	DockerConfig string
	// Progress, if set, is told each step of each fetch. It is called
	// from the fetching goroutines, several at once.
	Progress func(Event)
	// Linked, if set, is told the name of each source whose link a Sync
	// changed, as soon as it changed and before Sync returns, so that a
	// reloader that does not watch LinkDir can serve it at once rather
	// than when the slowest source's fetch ends. It is called from the
	// fetching goroutines, several at once, and must not block.
	Linked func(name string)
}

// Status is what the manager knows of one source.
type Status struct {
	Name   string `json:"name"`
	Source string `json:"source"`
	// Digest is the OCI manifest digest the tag last resolved to that
	// was verified (a failed newer one leaves it).
	Digest string `json:"digest,omitempty"`
	// SHA256 is the digest of that version's bytes, the blob linked; the
	// reloader serves it once it has compiled.
	SHA256 string `json:"sha256,omitempty"`
	// Verified says what vouched for the bytes: "key PATH (sha256:…)",
	// "sha256 pin", or "skipped (insecure_skip_signature)".
	Verified string `json:"verified,omitempty"`
	// Error is why the last fetch failed; the version above, if any, goes
	// on serving.
	Error   string    `json:"error,omitempty"`
	Checked time.Time `json:"checked"`
	// Stored says the version above was taken from the store at start
	// ([Manager.Restore]) and the source has not answered since: for a
	// tag, a newer version may exist.
	Stored bool `json:"stored,omitempty"`
	// Stage is the stage of the fetch under way ("resolve", "verify",
	// "download"), "" when none is; StageSince is when it began.
	Stage      string    `json:"stage,omitempty"`
	StageSince time.Time `json:"stageSince,omitzero"`
	// StoreChanged, if set, says the stored bytes of the version served
	// before were found changed on disk, refused, and fetched again
	// (ErrStoreChanged); it stays until the next fetch.
	StoreChanged string `json:"storeChanged,omitempty"`
}

// Manager fetches sources into the store and keeps their links. It is
// safe for concurrent use; one Sync runs at a time.
type Manager struct {
	opts   Options
	log    *slog.Logger
	client *http.Client

	sync sync.Mutex
	mu   sync.Mutex
	// reg orders renewals of the registration and Close, so that a
	// renewal cannot write it again once Close removed it.
	reg  sync.Mutex
	ents map[string]*entry // by name
	// pending counts, by sha256, the fetches that stored a blob and have
	// not linked it yet: forget keeps it.
	pending map[string]int
	// unregistered: the link folder could not be registered in the
	// store (Dir/links), or Close unregistered it, so forget removes
	// nothing.
	unregistered bool
	// registered is the path of the registration (Dir/links/…); view
	// names this process's view of the file system (fsView), set by New.
	registered string
	view       string
	// unseen holds the registrations whose link folder was found not to
	// be seen from here, said once in the log.
	unseen map[string]bool
}

type entry struct {
	spec   Spec
	status Status
	// verifiedUnder names the settings the version linked was verified
	// under (recordKey: the source, the pin, the public keys' contents,
	// the signature switch); "" when none is linked.
	verifiedUnder string
}

// New returns a manager, making its folders.
func New(opts Options) (*Manager, error) {
	if opts.Dir == "" || opts.LinkDir == "" {
		return nil, errors.New("sources: Dir and LinkDir are required")
	}
	// The store's own folders are made as it is written, through its
	// root (writeStore).
	for _, d := range []string{opts.Dir, opts.LinkDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("sources: %w", err)
		}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.StageTimeout <= 0 {
		opts.StageTimeout = DefaultStageTimeout
	}
	m := &Manager{opts: opts, log: opts.Logger, ents: map[string]*entry{}, pending: map[string]int{}, view: fsView(), unseen: map[string]bool{}}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if err := m.register(); err != nil {
		// A store this process cannot write in (an image's, filled by
		// serve --prepare, under a read-only root file system) still
		// serves what it holds. Unregistered, this manager's links are
		// invisible to forget, so it removes nothing.
		m.log.Warn("plugin store: the link folder is not registered in the store, so versions no longer served are not removed", "dir", m.opts.Dir, "error", err)
		m.unregistered = true
	}
	m.client = safeClient(opts.Client, opts.StageTimeout)
	return m, nil
}

// LinkDir is the folder of links to serve.
func (m *Manager) LinkDir() string { return m.opts.LinkDir }

// Status returns each source's status, sorted by name.
func (m *Manager) Status() []Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []Status{}
	for _, name := range slices.Sorted(maps.Keys(m.ents)) {
		out = append(out, m.ents[name].status)
	}
	return out
}

// Lookup returns the status of the source named name.
func (m *Manager) Lookup(name string) (Status, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.ents[name]
	if e == nil {
		return Status{}, false
	}
	return e.status, true
}

// Sync brings the links in step with specs: each source is resolved (a
// tag to its digest) and, if that changed or its stored bytes are gone or
// damaged, fetched and verified anew; links of names no longer asked for
// are removed. A source that fails keeps its link (the version served goes
// on) and its status says why, unless the version served was verified
// under other settings than its spec's (another public key, pin, source
// or signature switch): that link is removed. Sync reports whether any link changed, and
// the errors. Sources are fetched in parallel, at most 4 at a time.
func (m *Manager) Sync(ctx context.Context, specs []Spec) (bool, []error) {
	m.sync.Lock()
	defer m.sync.Unlock()
	m.renew()
	want := map[string]bool{}
	for _, s := range specs {
		want[s.Name] = true
	}
	changed := false
	m.mu.Lock()
	for name := range m.ents {
		if !want[name] {
			delete(m.ents, name)
			_ = os.Remove(m.link(name))
			changed = true
		}
	}
	m.mu.Unlock()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 4)
	)
	for _, s := range specs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ch, err := m.syncOne(ctx, s)
			if ch && m.opts.Linked != nil {
				m.opts.Linked(s.Name)
			}
			mu.Lock()
			defer mu.Unlock()
			changed = changed || ch
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	// No fetch of m is under way now (one Sync runs at a time).
	m.sweep()
	return changed, errs
}

// Prune unlinks at once, without the network and without waiting for a
// Sync under way, what specs no longer allow to be served: the sources
// no longer asked for, and those whose version linked was verified under
// other settings than their spec's (another public key, pin, source or
// signature switch). The next Sync fetches and verifies those again; a
// Sync under way forgets what it fetched for them. Prune reports whether
// any link was removed.
func (m *Manager) Prune(specs []Spec) bool {
	want := map[string]Spec{}
	for _, s := range specs {
		want[s.Name] = s
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := false
	for name, e := range m.ents {
		s, ok := want[name]
		switch {
		case !ok:
			delete(m.ents, name)
		case e.verifiedUnder != "" && e.verifiedUnder != recordKey(s):
			m.log.Warn("plugin source: the version served was verified under other settings: not served until verified under these", "plugin", name, "source", s.Source, "sha256", e.status.SHA256)
			m.ents[name] = &entry{spec: s, status: Status{Name: name, Source: s.Source}}
		default:
			continue
		}
		_ = os.Remove(m.link(name))
		changed = true
	}
	return changed
}

func (m *Manager) link(name string) string {
	return filepath.Join(m.opts.LinkDir, name+".wasm")
}

func (m *Manager) blob(sha string) string {
	return filepath.Join(m.opts.Dir, "blobs", "sha256", sha)
}

// syncOne fetches one source if it changed, and reports whether its link
// changed.
func (m *Manager) syncOne(ctx context.Context, s Spec) (bool, error) {
	m.mu.Lock()
	e := m.ents[s.Name]
	if e == nil {
		e = &entry{status: Status{Name: s.Name, Source: s.Source}}
		m.ents[s.Name] = e
	}
	prev := e.status
	under, prevUnder := recordKey(s), e.verifiedUnder
	// A public key rewritten in place is other settings too.
	sameSpec := specEqual(e.spec, s) && e.verifiedUnder == under
	e.spec = s
	m.mu.Unlock()
	if s.MaxSize == 0 {
		s.MaxSize = DefaultMaxSize
	}
	// A stored version that no longer hashes to its name was changed on
	// disk: refused and reported (log, status, Sync's errors), then
	// fetched again below.
	var changedOnDisk error
	if prev.SHA256 != "" && !m.intact(prev.SHA256, s.MaxSize) {
		changedOnDisk = fmt.Errorf("plugin %q (%s): %w: the stored bytes of sha256 %s are missing or no longer hash to it; refused, and fetched again", s.Name, s.Source, ErrStoreChanged, prev.SHA256)
		m.log.Error("plugin store entry changed on disk: refused, fetching it again", "plugin", s.Name, "source", s.Source, "sha256", prev.SHA256)
		prev.Digest, prev.SHA256 = "", ""
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	if ref, err := Parse(s.Source); err == nil {
		switch {
		case ref.URL != nil:
			ctx = withHops(ctx, hostPort(ref.URL))
		case ref.Registry != "":
			scheme := "https"
			if isLoopback(ref.Registry) {
				scheme = "http"
			}
			ctx = withHops(ctx, hostPort(&url.URL{Scheme: scheme, Host: ref.Registry}))
		}
	}
	res, err := m.fetch(ctx, s, prev, sameSpec)
	// The version the link moved off is forgotten once m.mu is let go
	// (forget reads the store).
	var moved string
	defer func() {
		if moved != "" {
			m.forget(moved)
		}
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	if res.stored {
		defer m.unpend(res.sha)
	}
	if m.ents[s.Name] != e { // removed meanwhile
		return false, nil
	}
	e.status.Checked = time.Now()
	e.status.Stage, e.status.StageSince = "", time.Time{}
	if err != nil {
		err = errors.Join(changedOnDisk, fmt.Errorf("plugin %q (%s): %w", s.Name, s.Source, err))
		e.status.Error = err.Error()
		if prev.SHA256 != "" && e.verifiedUnder != "" && e.verifiedUnder != under {
			// The version served was verified under other settings
			// (another key, source or pin, or none): it is not
			// verified under these, and is not served (nor would a
			// restart serve it: Restore uses no record made under
			// other settings).
			_ = os.Remove(m.link(s.Name))
			e.status.Digest, e.status.SHA256, e.status.Verified = "", "", ""
			e.verifiedUnder = ""
			m.log.Error("plugin source refused under its new settings: the version served, verified under the old ones, is no longer served", "plugin", s.Name, "source", s.Source, "sha256", prev.SHA256, "error", err)
			return true, err
		}
		if prev.SHA256 != "" {
			m.log.Error("plugin source refused: the version served goes on", "plugin", s.Name, "source", s.Source, "serving", prev.SHA256, "error", err)
		} else {
			m.log.Error("plugin source refused", "plugin", s.Name, "source", s.Source, "error", err)
		}
		return false, err
	}
	e.status = Status{Name: s.Name, Source: s.Source, Digest: res.digest, SHA256: res.sha, Verified: res.verified, Checked: e.status.Checked}
	e.verifiedUnder = under
	if changedOnDisk != nil {
		e.status.StoreChanged = changedOnDisk.Error()
	}
	m.remember(s, e.status)
	if prev.Stored {
		m.log.Info("plugin source answered: the stored version is current", "plugin", s.Name, "source", s.Source, "sha256", res.sha, "same", res.sha == prev.SHA256)
	}
	if changedOnDisk == nil && res.sha == prev.SHA256 && linkTarget(m.link(s.Name)) == m.blob(res.sha) {
		return false, nil
	}
	old := filepath.Base(linkTarget(m.link(s.Name)))
	if err := m.relink(s.Name, res.sha); err != nil {
		e.status = prev
		e.status.Error = err.Error()
		e.verifiedUnder = prevUnder
		return false, errors.Join(changedOnDisk, err)
	}
	if old != res.sha {
		moved = old
	}
	m.log.Info("plugin source fetched", "plugin", s.Name, "source", s.Source, "digest", res.digest, "sha256", res.sha, "verified", res.verified)
	return true, changedOnDisk
}

func specEqual(a, b Spec) bool {
	return a.Name == b.Name && a.Source == b.Source && a.SHA256 == b.SHA256 && slices.Equal(a.PublicKeys, b.PublicKeys) &&
		a.InsecureSkipSignature == b.InsecureSkipSignature && a.MaxSize == b.MaxSize &&
		(a.Credential == nil) == (b.Credential == nil) && (a.Credential == nil || *a.Credential == *b.Credential)
}

func linkTarget(path string) string {
	t, _ := os.Readlink(path)
	return t
}

// relink points NAME.wasm at the blob, atomically (a new link renamed
// over the old).
func (m *Manager) relink(name, sha string) error {
	tmp := filepath.Join(m.opts.LinkDir, "."+name+".wasm.tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(m.blob(sha), tmp); err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := os.Rename(tmp, m.link(name)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("link %s: %w", name, err)
	}
	return nil
}

type result struct {
	digest, sha, verified string
	stored                bool // sha was stored by this fetch (pending until linked)
}

// fetch gets s's bytes into the store, verified, unless what prev serves
// is still what s resolves to and its stored bytes are intact.
func (m *Manager) fetch(ctx context.Context, s Spec, prev Status, sameSpec bool) (_ result, err error) {
	// The source's scheme only: a URL's path and query can hold tokens.
	scheme, _, _ := strings.Cut(s.Source, "://")
	ctx, span := telemetry.Start(ctx, "wasmtools.fetch", attribute.String("wasmtools.plugin", s.Name), attribute.String("url.scheme", scheme))
	defer func() { telemetry.End(span, err) }()
	ref, err := Parse(s.Source)
	if err != nil {
		return result{}, err
	}
	if s.SHA256 != "" && !hexSHA(s.SHA256) {
		return result{}, fmt.Errorf("sha256 pin %q: want 64 lower-case hex digits", s.SHA256)
	}
	if s.InsecureSkipSignature {
		m.log.Warn("INSECURE: plugin served without signature verification (insecure_skip_signature = true)", "plugin", s.Name, "source", s.Source)
	}
	var res result
	var wasm []byte
	if ref.File != "" {
		if wasm, err = readSourceFile(ref.File, s.MaxSize); err != nil {
			return result{}, err
		}
		res.verified = "local file"
		if s.SHA256 != "" {
			res.verified = "sha256 pin"
		}
	} else if ref.URL != nil {
		if s.SHA256 == "" && !s.InsecureSkipSignature {
			return result{}, fmt.Errorf("an https source needs a sha256 pin (or insecure_skip_signature = true): TLS says who served the bytes, not that they are the ones you meant")
		}
		if sameSpec && prev.SHA256 != "" && s.SHA256 == prev.SHA256 && m.intact(prev.SHA256, s.MaxSize) {
			return result{sha: prev.SHA256, verified: prev.Verified}, nil
		}
		wasm, err = m.fetchHTTPS(ctx, s, ref.URL)
		if err != nil {
			return result{}, err
		}
		res.verified = "sha256 pin"
		if s.SHA256 == "" {
			res.verified = "skipped (insecure_skip_signature)"
		}
	} else {
		if ref.Digest != "" && sameSpec && prev.Digest == ref.Digest && prev.SHA256 != "" && m.intact(prev.SHA256, s.MaxSize) {
			// A digest pin cannot move: its verified bytes are final.
			return result{digest: prev.Digest, sha: prev.SHA256, verified: prev.Verified}, nil
		}
		o := &ociFetch{m: m, spec: s, ref: ref}
		digest, err := o.resolve(ctx)
		if err != nil {
			return result{}, err
		}
		if sameSpec && digest == prev.Digest && prev.SHA256 != "" && m.intact(prev.SHA256, s.MaxSize) {
			return result{digest: digest, sha: prev.SHA256, verified: prev.Verified}, nil
		}
		if prev.Digest != "" && digest != prev.Digest {
			m.log.Info("plugin tag moved", "plugin", s.Name, "source", s.Source, "from", prev.Digest, "to", digest)
		}
		if wasm, res.verified, err = o.pull(ctx); err != nil {
			return result{}, err
		}
		res.digest = digest
	}
	sum := sha256.Sum256(wasm)
	res.sha = hex.EncodeToString(sum[:])
	if s.SHA256 != "" && res.sha != s.SHA256 {
		return result{}, fmt.Errorf("%w: the bytes' sha256 is %s, the pin %s", ErrPin, res.sha, s.SHA256)
	}
	m.mu.Lock()
	m.pending[res.sha]++
	m.mu.Unlock()
	if err := m.store(res.sha, wasm); err != nil {
		m.mu.Lock()
		m.unpend(res.sha)
		m.mu.Unlock()
		return result{}, err
	}
	res.stored = true
	return res, nil
}

// intact reports whether the stored blob sha exists and still hashes to
// its name.
func (m *Manager) intact(sha string, max uint64) bool {
	b, err := m.readStore(filepath.Join("blobs", "sha256"), sha, max)
	if err != nil {
		return false
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]) == sha
}

// store writes wasm to the store under its sha256 (written to a temporary
// file and renamed, so a reader never sees half a blob).
func (m *Manager) store(sha string, wasm []byte) error {
	if err := m.writeStore(filepath.Join("blobs", "sha256"), sha, "."+sha+".", wasm); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// Check verifies bytes read from a link of this manager against the
// digest that was verified when they were fetched: the reloader's check
// hook, so the store is verified on every load. It passes paths that are
// not this manager's links. A mismatch (the store was changed on disk) is
// refused, and the next Sync fetches the source again.
func (m *Manager) Check(path string, wasm []byte) error {
	if filepath.Clean(filepath.Dir(path)) != filepath.Clean(m.opts.LinkDir) {
		return nil
	}
	name := strings.TrimSuffix(filepath.Base(path), ".wasm")
	m.mu.Lock()
	e := m.ents[name]
	var want string
	if e != nil {
		want = e.status.SHA256
	}
	m.mu.Unlock()
	if want == "" {
		return fmt.Errorf("source of %q: no verified version fetched", name)
	}
	sum := sha256.Sum256(wasm)
	if got := hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("stored bytes of %q have sha256 %s, not the verified %s: the store was changed on disk (fetched again on the next reload)", name, got, want)
	}
	return nil
}
