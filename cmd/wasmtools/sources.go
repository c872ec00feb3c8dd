package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/fsnotify/fsnotify"
	"github.com/wasmtools/wasmtools/internal/config"
	"github.com/wasmtools/wasmtools/internal/sources"
	"github.com/wasmtools/wasmtools/plugins"
)

// sourceFlags are serve's flags for remote plugins.
type sourceFlags struct {
	publicKey  string
	insecure   bool
	dir        string
	refresh    time.Duration
	hyperMCP   string
	remoteArgs []string // NAME=SOURCE or SOURCE, from the command line
}

func (s *sourceFlags) register(fs *flag.FlagSet, common *commonFlags) {
	fs.StringVar(&s.publicKey, "public-key", "", "PEM public `FILE` (cosign.pub) that OCI plugins' cosign signatures must verify with, for plugins without a public_key in the configuration")
	fs.BoolVar(&s.insecure, "insecure-skip-signature", false, "serve OCI plugins without verifying their signatures, and HTTPS plugins without a sha256 pin (logged as a warning on every fetch)")
	fs.StringVar(&s.dir, "source-dir", defaultSourceDir(), "the content-addressed `DIR` where remote plugins are stored")
	fs.DurationVar(&s.refresh, "refresh", 0, "resolve remote plugins' tags again this often, swapping in a moved tag once verified (0: the configuration's [sources] refresh_interval, else only at start and on \"wasmtools reload\")")
	fs.StringVar(&common.hyperPath, "hyper-mcp-config", "", "serve the plugins of hyper-mcp's configuration `FILE` (JSON, YAML or TOML): URLs, runtime_config and the signature setting are mapped; what cannot be is an error naming it")
}

// defaultSourceDir is where remote plugins are stored between runs.
func defaultSourceDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "wasmtools-sources")
	}
	return filepath.Join(dir, "wasmtools", "sources")
}

// splitArgs separates serve's local paths from remote sources.
func (s *sourceFlags) splitArgs(args []string) (local []string) {
	for _, a := range args {
		_, src, named := strings.Cut(a, "=")
		isFile := func(s string) bool { return strings.HasPrefix(strings.ToLower(s), "file://") }
		switch {
		case isFile(a):
			// A file named as hyper-mcp names it is served in place,
			// like its path: watched, so that a change to it is seen.
			if ref, err := sources.Parse(a); err == nil {
				local = append(local, ref.File)
			} else {
				local = append(local, a) // refused with the path's error
			}
		case sources.IsRemote(a) || named && (sources.IsRemote(src) || isFile(src)):
			s.remoteArgs = append(s.remoteArgs, a)
		default:
			local = append(local, a)
		}
	}
	return local
}

// argName is the plugin name of a command-line source: NAME= if given,
// else the repository's (or URL's) last path element, without ".wasm".
func argName(arg string) (name, src string) {
	if n, s, ok := strings.Cut(arg, "="); ok && !sources.IsRemote(arg) {
		return n, s
	}
	ref, err := sources.Parse(arg)
	switch {
	case err != nil:
		return "", arg
	case ref.URL != nil:
		return strings.TrimSuffix(path.Base(ref.URL.Path), ".wasm"), arg
	default:
		return path.Base(ref.Repository), arg
	}
}

// specs lists the remote plugins asked for: the configuration's sources,
// then the command line's.
func (s *sourceFlags) specs(cfg *config.File) ([]sources.Spec, error) {
	var out []sources.Spec
	var errs []error
	seen := map[string]string{}
	add := func(name, src string) {
		if prev, ok := seen[name]; ok {
			errs = append(errs, fmt.Errorf("plugin %q: two sources (%s and %s): name one with NAME=SOURCE", name, prev, src))
			return
		}
		seen[name] = src
		eff := cfg.For(name)
		if !eff.Enabled {
			return
		}
		spec := sources.Spec{
			Name: name, Source: src, SHA256: eff.SHA256, PublicKeys: eff.PublicKeys,
			InsecureSkipSignature: eff.InsecureSkipSignature || s.insecure,
			MaxSize:               eff.Options.Policy.ModuleLimits().MaxModuleSize,
		}
		if len(spec.PublicKeys) == 0 && s.publicKey != "" {
			spec.PublicKeys = []string{s.publicKey}
		}
		if ref, err := sources.Parse(src); err != nil {
			errs = append(errs, err)
			return
		} else if c := sourceCredential(cfg, ref); c != nil {
			spec.Credential = &sources.Credential{Username: c.Username, Password: c.Password, Token: c.Token}
		}
		out = append(out, spec)
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n, p := range cfg.Plugins {
			if p.Source != "" && !yield(n) {
				return
			}
		}
	}) {
		add(name, cfg.Plugins[name].Source)
	}
	for _, a := range s.remoteArgs {
		name, src := argName(a)
		if name == "" || strings.HasPrefix(name, ".") || strings.ContainsAny(name, `/\`) {
			errs = append(errs, fmt.Errorf("source %q: cannot name its plugin: give NAME=SOURCE", a))
			continue
		}
		add(name, src)
	}
	return out, errors.Join(errs...)
}

// sourceCredential is the login for ref: an HTTPS source's by its URL
// (hyper-mcp's auths, by prefix) or host, an OCI source's by registry.
func sourceCredential(cfg *config.File, ref sources.Ref) *config.Credential {
	if ref.URL != nil {
		return cfg.SourceCredential(ref.URL.String(), ref.URL.Host)
	}
	return cfg.Credential(ref.Registry)
}

func registryHost(ref sources.Ref) string {
	if ref.URL != nil {
		return ref.URL.Host
	}
	return ref.Registry
}

// remote fetches the remote plugins into the reloader's view: it owns the
// sources.Manager, and each refresh is a Sync and, if a link changed, a
// rescan, one at a time.
type remote struct {
	mgr      *sources.Manager
	flags    *sourceFlags
	common   *commonFlags
	log      *slog.Logger
	progress *progressUI
	mu       sync.Mutex
	// linked is signalled when a sync changes a link (sources.Options.
	// Linked): sync serves it then, not after the slowest source.
	linked chan struct{}
}

// newRemote returns nil when nothing remote is asked for (and none may be
// later: a configuration change adding a source needs a restart then).
func newRemote(flags *sourceFlags, common *commonFlags, log *slog.Logger, ui *progressUI) (*remote, error) {
	specs, err := flags.specs(common.config())
	if err != nil {
		return nil, err
	}
	if len(specs) == 0 {
		return nil, nil
	}
	links, err := os.MkdirTemp("", "wasmtools-links-")
	if err != nil {
		return nil, err
	}
	cfg := common.config()
	linked := make(chan struct{}, 1)
	mgr, err := sources.New(sources.Options{
		Dir: flags.dir, LinkDir: links, Logger: log,
		Timeout: time.Duration(cfg.Sources.Timeout), StageTimeout: time.Duration(cfg.Sources.StageTimeout), DockerConfig: cfg.Sources.DockerConfig,
		Progress: ui.event,
		Linked: func(string) {
			select {
			case linked <- struct{}{}:
			default: // a rescan is due already: it sees this link too
			}
		},
	})
	if err != nil {
		os.RemoveAll(links)
		return nil, err
	}
	return &remote{mgr: mgr, flags: flags, common: common, log: log, progress: ui, linked: linked}, nil
}

// close unregisters the link folder from the store and removes it.
func (r *remote) close() {
	if r != nil {
		if err := r.mgr.Close(); err != nil {
			r.log.Warn("plugin store: the link folder stays registered", "error", err)
		}
		os.RemoveAll(r.mgr.LinkDir())
	}
}

// restore links the sources whose verified bytes the store holds, with
// no network (sources.Manager.Restore).
func (r *remote) restore(ctx context.Context) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	specs, err := r.flags.specs(r.common.config())
	if err != nil {
		return []error{err}
	}
	_, errs := r.mgr.Restore(ctx, specs)
	return errs
}

// sync fetches what changed; rescan, if set, serves it.
func (r *remote) sync(ctx context.Context, rescan func(context.Context) (bool, []error)) (bool, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	specs, err := r.flags.specs(r.common.config())
	if err != nil {
		return false, []error{err}
	}
	if rescan == nil {
		return r.mgr.Sync(ctx, specs)
	}
	// Each source is served as soon as it is linked: a rescan on each
	// link changed while the others are fetched, so that a registry
	// stalling one source's download (up to its timeout) holds up no
	// other, with or without a watch of the link folder. A last rescan
	// after the sync serves what the ones under way missed.
	// One serve at a time: the rescans' goroutine, then, once it ended,
	// the last one; so swapped and rerrs need no lock.
	var (
		swapped  bool
		rerrs    []error
		rescans  sync.WaitGroup
		syncDone = make(chan struct{})
	)
	serve := func(fetched bool) {
		start := time.Now()
		done := r.progress.compiling(fetched)
		ch, es := rescan(ctx)
		done()
		if ch {
			r.log.Info("plugins compiled and swapped in", "elapsed", time.Since(start).Round(time.Millisecond))
		}
		swapped = swapped || ch
		rerrs = append(rerrs, es...)
	}
	select {
	case <-r.linked: // left by a sync before: this one rescans anyway
	default:
	}
	rescans.Go(func() {
		for {
			select {
			case <-syncDone:
				return
			case <-r.linked:
				serve(true)
			}
		}
	})
	changed, errs := r.mgr.Sync(ctx, specs)
	close(syncDone)
	rescans.Wait()
	fetched := false // a link changed since the last rescan began
	select {
	case <-r.linked:
		fetched = true
	default:
	}
	serve(fetched)
	return changed || swapped, append(errs, rerrs...)
}

// prune unlinks at once what the configuration in force no longer lets be
// served (see sources.Manager.Prune), even while a sync is under way.
func (r *remote) prune() {
	if r == nil {
		return
	}
	specs, err := r.flags.specs(r.common.config())
	if err != nil {
		return // the sync reports it
	}
	r.mgr.Prune(specs)
}

// check is the reloader's check: the configuration's pin, then the
// store's digest for linked plugins.
func (r *remote) check(pin func(string, []byte) error) func(string, []byte) error {
	if r == nil {
		return pin
	}
	return func(path string, wasm []byte) error {
		if err := r.mgr.Check(path, wasm); err != nil {
			return err
		}
		return pin(path, wasm)
	}
}

// refreshEvery resyncs at the interval until ctx ends.
func (r *remote) refreshEvery(ctx context.Context, every time.Duration, rl *plugins.Reloader) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.sync(ctx, rl.Rescan)
		}
	}
}

// progressUI shows fetches: bars (size, speed) and a compile spinner on a
// terminal, log lines otherwise. It is also the writer of the log: on a
// terminal, a log line first clears the line a bar is drawn on (the bar is
// drawn again on its next step), so that the two never tangle; and a
// finished pull leaves a line with its size, time and speed.
type progressUI struct {
	w   io.Writer
	tty bool
	log *slog.Logger

	mu    sync.Mutex
	bars  map[string]*progressbar.ProgressBar
	drawn bool // a bar or spinner may be on the current line
}

func newProgressUI(stderr io.Writer) *progressUI {
	p := &progressUI{w: stderr, bars: map[string]*progressbar.ProgressBar{}}
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty = true
	}
	return p
}

// Write writes a log line, clearing a bar's line first.
func (p *progressUI) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.drawn {
		io.WriteString(p.w, "\r\x1b[K")
		p.drawn = false
	}
	return p.w.Write(b)
}

// barWriter is what the bars write through: it marks the line drawn.
type barWriter struct{ p *progressUI }

func (w barWriter) Write(b []byte) (int, error) {
	w.p.drawn = true // under p.mu: bars are drawn from event, which holds it
	return w.p.w.Write(b)
}

func (p *progressUI) event(ev sources.Event) {
	if !p.tty {
		if ev.Stage == "done" {
			rate := float64(ev.Done) / max(ev.Elapsed.Seconds(), 1e-3) / (1 << 20)
			p.log.Info("plugin downloaded", "plugin", ev.Name, "bytes", ev.Done, "elapsed", ev.Elapsed.Round(time.Millisecond), "MiB/s", fmt.Sprintf("%.1f", rate))
		}
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev.Stage {
	case "download", "done":
		bar := p.bars[ev.Name]
		if bar == nil {
			bar = progressbar.NewOptions64(ev.Total,
				progressbar.OptionSetWriter(barWriter{p}),
				progressbar.OptionSetDescription("pulling "+ev.Name),
				progressbar.OptionShowBytes(true),
				progressbar.OptionShowCount(),
				progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionClearOnFinish(),
			)
			p.bars[ev.Name] = bar
		}
		_ = bar.Set64(ev.Done)
		if ev.Stage == "done" {
			_ = bar.Finish()
			delete(p.bars, ev.Name)
			rate := float64(ev.Done) / max(ev.Elapsed.Seconds(), 1e-3) / (1 << 20)
			fmt.Fprintf(p.w, "\r\x1b[Kpulled %s: %.1f MiB in %v (%.1f MiB/s)\n", ev.Name, float64(ev.Done)/(1<<20), ev.Elapsed.Round(time.Millisecond), rate)
			p.drawn = false
		}
	}
}

// compiling shows a spinner while the plugins fetched compile; the
// returned function stops it.
func (p *progressUI) compiling(fetched bool) func() {
	if !fetched {
		return func() {}
	}
	if !p.tty {
		p.log.Info("compiling the plugins fetched")
		return func() {}
	}
	bar := progressbar.NewOptions(-1, progressbar.OptionSetWriter(barWriter{p}), progressbar.OptionSetDescription("compiling"),
		progressbar.OptionSpinnerType(14), progressbar.OptionClearOnFinish())
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				p.mu.Lock()
				_ = bar.Finish()
				p.mu.Unlock()
				return
			case <-t.C:
				p.mu.Lock()
				_ = bar.Add(1)
				p.mu.Unlock()
			}
		}
	}()
	return func() { close(stop); <-done }
}

// cmdReload asks a running HTTP server to resolve its remote plugins
// again (and rescan its folders).
func cmdReload(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("reload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	u := fs.String("url", "http://127.0.0.1:8080", "the `URL` of a running \"wasmtools serve --http\" server")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: wasmtools reload [--url URL]\n\nAsks a running HTTP server to resolve its remote plugins again (a moved\ntag is fetched, verified and swapped in) and to rescan its folders.\nWASMTOOLS_OPERATOR_TOKEN, if set, is sent as the bearer token: a server\nserves /reload only to its operator (http.operator_token).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return flagsExit(err)
	}
	token := operatorToken(lookupEnv)
	var rep reloadReport
	if code := requestJSON(ctx, "reload", http.MethodPost, baseURL(*u)+"/reload", token, 10*time.Minute, &rep, stderr); code != 0 {
		return code
	}
	fmt.Fprintf(stdout, "changed: %v\n", rep.Changed)
	for _, e := range rep.Errors {
		fmt.Fprintf(stdout, "error: %s\n", e)
	}
	if len(rep.Errors) > 0 {
		return 1
	}
	return 0
}

// reloadReport is what POST /reload answers.
type reloadReport struct {
	Changed bool     `json:"changed"`
	Errors  []string `json:"errors"`
}

// fileSources are the paths of the file:// sources asked for now (the
// configuration's, hyper-mcp's, NAME=file:// on the command line).
func (r *remote) fileSources() map[string]bool {
	out := map[string]bool{}
	specs, err := r.flags.specs(r.common.config())
	if err != nil {
		return out
	}
	for _, s := range specs {
		if ref, err := sources.Parse(s.Source); err == nil && ref.File != "" {
			out[filepath.Clean(ref.File)] = true
		}
	}
	return out
}

// watchFiles follows the file:// sources until ctx ends: a change of one
// (written in place, renamed over, or through Kubernetes' ..data) is
// synced into the store and served, as a moved tag is. Without it a
// hyper-mcp user's local plugins, which the store copies, would change
// only at `wasmtools reload`. again is signalled when the configuration
// changed (the sources may have).
func (r *remote) watchFiles(ctx context.Context, again <-chan struct{}, rescan func(context.Context) (bool, []error)) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		r.log.Warn("file sources are not watched", "error", err)
		return
	}
	defer w.Close()
	files, dirs := map[string]bool{}, map[string]bool{}
	follow := func() {
		files = r.fileSources()
		for f := range files {
			if d := filepath.Dir(f); !dirs[d] {
				if err := w.Add(d); err != nil {
					r.log.Warn("file source not watched: changes to it are taken at `wasmtools reload`", "path", f, "error", err)
					continue
				}
				dirs[d] = true
			}
		}
	}
	follow()
	var timer *time.Timer
	fire := make(chan struct{}, 1)
	for {
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-again:
			follow()
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			name := filepath.Clean(ev.Name)
			if !files[name] && (filepath.Base(name) != plugins.K8sDataLink || !dirs[filepath.Dir(name)]) {
				continue
			}
			// As for plugin folders: quiet for the time a file written
			// in place needs (plugins.ReloaderOptions.SettleWrite).
			if timer == nil {
				timer = time.AfterFunc(250*time.Millisecond, func() {
					select {
					case fire <- struct{}{}:
					default:
					}
				})
			} else {
				timer.Reset(250 * time.Millisecond)
			}
		case <-fire:
			if _, errs := r.sync(ctx, rescan); len(errs) > 0 {
				r.log.Debug("file source sync finished with errors", "errors", len(errs))
			}
		}
	}
}
