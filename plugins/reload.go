package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/wasmtools/wasmtools/sandbox"
)

// Plugin states in a [Status].
const (
	StateLoaded   = "loaded"
	StateError    = "error"
	StateDisabled = "disabled"
)

// Status is what the reloader knows of one plugin file.
type Status struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// SHA256 is the version served, "" when none is.
	SHA256 string `json:"sha256,omitempty"`
	// State is loaded, error (Error says why; an older version may still
	// be served, see SHA256) or disabled.
	State string   `json:"state"`
	Error string   `json:"error,omitempty"`
	Tools []string `json:"tools"`
	// LastReload is when the file was last read, successfully or not.
	LastReload time.Time `json:"lastReload"`
}

// Swap is one change of the served catalogue.
type Swap struct {
	Next *Catalogue
	// Replaced maps each plugin no longer served to the plugin that
	// replaces it (same name, new code); Removed lists those with none.
	// The host retires their instances, then calls Done.
	Replaced map[*Plugin]*Plugin
	Removed  []*Plugin
}

// ReloaderOptions configures a [Reloader].
type ReloaderOptions struct {
	// Paths are the folders and files served (see [Discover]).
	Paths []string
	// OptionsFor gives each file's load options; nil means defaults.
	OptionsFor func(path string) Options
	// Check, if set, vets a file's bytes before they are compiled (for
	// example against a sha256 pin); its error refuses that version.
	Check func(path string, wasm []byte) error
	// Logger receives reload messages; nil discards them.
	Logger *slog.Logger
	// Settle is how long a file must be quiet after a create or rename
	// before it is read; a file written in place must be quiet for
	// SettleWrite. Defaults: 25ms and 250ms. Writing to a temporary name
	// and renaming into the folder is the safe way to deploy: the file
	// appears whole, and is read after Settle.
	Settle, SettleWrite time.Duration
}

// Reloader keeps a catalogue in step with plugin folders: it loads what
// appears, swaps in what changes, drops what disappears, and keeps serving
// the old version of a plugin whose new version is bad. It is safe for
// concurrent use.
type Reloader struct {
	rt   *sandbox.Runtime
	opts ReloaderOptions
	log  *slog.Logger

	mu     sync.Mutex // serialises reloads and guards what follows
	gen    int        // bumped by Reconfigure: every file is read again
	cat    *Catalogue
	files  map[string]*fileState // by path
	onSwap func(ctx context.Context, s Swap)
}

type fileState struct {
	plugin  *Plugin // the version served, nil if none
	status  Status
	lastBad string // sha256 of the last bytes refused
	gen     int    // the configuration generation plugin was loaded under
}

// NewReloader returns a reloader of the given paths. Call Load, then
// Watch.
func NewReloader(rt *sandbox.Runtime, opts ReloaderOptions) *Reloader {
	r := &Reloader{rt: rt, opts: opts, log: opts.Logger, files: map[string]*fileState{}}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.opts.Settle <= 0 {
		r.opts.Settle = 25 * time.Millisecond
	}
	if r.opts.SettleWrite <= 0 {
		r.opts.SettleWrite = 250 * time.Millisecond
	}
	return r
}

// OnSwap sets what is called with each new catalogue, under the reloader's
// lock (so swaps arrive in order). The host serves Next and retires the
// instances of replaced and removed plugins. OnSwap takes ownership of the
// replaced and removed plugins: it closes each once its instances are done
// with (calls in flight finish on it first). Without OnSwap, the reloader
// closes them at once.
func (r *Reloader) OnSwap(f func(ctx context.Context, s Swap)) {
	r.mu.Lock()
	r.onSwap = f
	r.mu.Unlock()
}

// Catalogue returns the catalogue being served.
func (r *Reloader) Catalogue() *Catalogue {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cat
}

// Status returns every plugin file's status, sorted by path.
func (r *Reloader) Status() []Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Status, 0, len(r.files))
	for _, f := range r.files {
		out = append(out, f.status)
	}
	slices.SortFunc(out, func(a, b Status) int { return cmpString(a.Path, b.Path) })
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// disabled reports whether the options of path say it is disabled. The
// caller holds r.mu.
func (r *Reloader) disabled(path string) bool {
	return r.opts.OptionsFor != nil && r.opts.OptionsFor(path).Disabled
}

// Reconfigure sets new load options and check (after the configuration
// file changed) and reads every plugin again under them: plugins whose
// settings changed are swapped like new versions.
func (r *Reloader) Reconfigure(ctx context.Context, optionsFor func(path string) Options, check func(path string, wasm []byte) error) (bool, []error) {
	r.mu.Lock()
	r.opts.OptionsFor, r.opts.Check = optionsFor, check
	r.gen++
	for _, f := range r.files {
		f.lastBad = ""
	}
	r.mu.Unlock()
	return r.Rescan(ctx)
}

// Load reads every plugin file and builds the first catalogue. Each
// failure is returned, and recorded in the file's status; the rest are
// served.
func (r *Reloader) Load(ctx context.Context) (*Catalogue, []error) {
	_, errs := r.Rescan(ctx)
	return r.Catalogue(), errs
}

// Rescan compares the plugin files with what is served and applies the
// difference: new files are loaded, changed ones (by sha256) swapped in,
// deleted ones dropped. It reports whether the catalogue changed, and the
// errors of files that failed (their old versions, if any, still served).
func (r *Reloader) Rescan(ctx context.Context) (bool, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cat == nil {
		r.cat, _ = NewCatalogue(nil)
	}
	files, errs := Discover(r.opts.Paths)
	present := map[string]bool{}
	changed := map[string]*Plugin{} // path -> new version
	for _, path := range files {
		if r.disabled(path) {
			continue // as if absent: a served version is dropped
		}
		present[path] = true
		if p, err := r.loadIfChanged(ctx, path); err != nil {
			errs = append(errs, err)
		} else if p != nil {
			changed[path] = p
		}
	}
	removed := map[string]bool{}
	for path, f := range r.files {
		if !present[path] && f.status.State != StateDisabled {
			removed[path] = true
			if f.plugin == nil {
				delete(r.files, path)
			}
		}
	}
	if len(changed) == 0 && len(removed) == 0 {
		return false, errs
	}

	// The new catalogue keeps the old order, so that a plugin already
	// served wins a collision over a newcomer.
	var order []*Plugin
	newPath := map[*Plugin]string{}
	{
		for _, p := range r.cat.Plugins() {
			if removed[p.Path()] {
				continue
			}
			if q, ok := changed[p.Path()]; ok {
				order = append(order, q)
				newPath[q] = p.Path()
				delete(changed, p.Path())
				continue
			}
			order = append(order, p)
		}
	}
	for _, path := range files { // newcomers, in discovery order
		if q, ok := changed[path]; ok {
			order = append(order, q)
			newPath[q] = path
		}
	}
	next, rejected := NewCatalogue(order)
	for _, rej := range rejected {
		path := newPath[rej.Plugin]
		f := r.files[path]
		f.status.State, f.status.Error = StateError, rej.Err.Error()
		errs = append(errs, rej.Err)
		r.log.Error("plugin version refused", "path", path, "error", rej.Err)
		_ = rej.Plugin.Close(ctx)
		if f.plugin != nil && f.plugin != rej.Plugin {
			// The old version goes on: put it back.
			order = slices.DeleteFunc(order, func(p *Plugin) bool { return p == rej.Plugin })
			order = append(order, f.plugin)
		}
	}
	if len(rejected) > 0 {
		next, _ = NewCatalogue(order)
	}

	swap := Swap{Next: next, Replaced: map[*Plugin]*Plugin{}}
	served := map[*Plugin]bool{}
	for _, p := range next.Plugins() {
		served[p] = true
	}
	{
		for _, p := range r.cat.Plugins() {
			if served[p] {
				continue
			}
			var by *Plugin
			for _, q := range next.Plugins() {
				if q.Name() == p.Name() {
					by = q
				}
			}
			if by != nil {
				swap.Replaced[p] = by
			} else {
				swap.Removed = append(swap.Removed, p)
			}
		}
	}
	for path := range removed {
		r.log.Info("plugin removed", "path", path)
		delete(r.files, path)
	}
	for _, path := range files {
		if r.disabled(path) {
			r.files[path] = &fileState{status: Status{Name: pluginName(path), Path: path, State: StateDisabled, Tools: []string{}, LastReload: time.Now()}}
		}
	}
	for _, p := range next.Plugins() {
		f := r.files[p.Path()]
		if f.plugin != p {
			f.plugin = p
			f.status.SHA256 = p.SHA256()
			f.status.State, f.status.Error = StateLoaded, ""
			f.status.Tools = toolNames(p)
			r.log.Info("plugin loaded", "plugin", p.Name(), "path", p.Path(), "sha256", p.SHA256(), "tools", len(p.Tools()))
		}
	}
	r.cat = next
	if r.onSwap != nil {
		r.onSwap(ctx, swap)
		return true, errs
	}
	for old := range swap.Replaced {
		_ = old.Close(ctx)
	}
	for _, old := range swap.Removed {
		_ = old.Close(ctx)
	}
	return true, errs
}

func toolNames(p *Plugin) []string {
	names := make([]string, 0, len(p.Tools()))
	for _, t := range p.Tools() {
		names = append(names, t.Name)
	}
	return names
}

// loadIfChanged reads path once and, if its bytes differ from the version
// served, checks and compiles those same bytes. It returns nil, nil when
// nothing changed.
func (r *Reloader) loadIfChanged(ctx context.Context, path string) (*Plugin, error) {
	f, ok := r.files[path]
	if !ok {
		f = &fileState{status: Status{Name: pluginName(path), Path: path, Tools: []string{}}}
		r.files[path] = f
	}
	wasm, err := readPluginFile(path, maxFileSize(r.opts.OptionsFor, path))
	if err != nil {
		return nil, r.fail(f, fmt.Errorf("plugin file %s: %w", path, err))
	}
	sum := sha256.Sum256(wasm)
	sha := hex.EncodeToString(sum[:])
	if f.plugin != nil && f.plugin.SHA256() == sha && f.gen == r.gen {
		return nil, nil
	}
	if f.lastBad == sha && f.gen == r.gen {
		return nil, nil // the same bad bytes again: already reported
	}
	f.status.LastReload = time.Now()
	f.gen = r.gen
	if r.opts.Check != nil {
		if err := r.opts.Check(path, wasm); err != nil {
			f.lastBad = sha
			return nil, r.fail(f, fmt.Errorf("plugin %q (%s): %w", f.status.Name, path, err))
		}
	}
	var opts Options
	if r.opts.OptionsFor != nil {
		opts = r.opts.OptionsFor(path)
	}
	p, err := Load(ctx, r.rt, path, wasm, opts)
	if err != nil {
		f.lastBad = sha
		return nil, r.fail(f, err)
	}
	return p, nil
}

func (r *Reloader) fail(f *fileState, err error) error {
	f.status.State, f.status.Error = StateError, err.Error()
	if f.plugin != nil {
		r.log.Error("plugin version refused: the old version goes on serving", "path", f.status.Path, "sha256", f.plugin.SHA256(), "error", err)
	} else {
		r.log.Error("plugin not loaded", "path", f.status.Path, "error", err)
	}
	return err
}

func pluginName(path string) string {
	base := filepath.Base(path)
	return base[:len(base)-len(filepath.Ext(base))]
}

// Watch follows the plugin folders (and the folders of plugin files given
// by name) until ctx ends, rescanning once the files that changed have
// settled. One rescan follows a burst of events, whatever their number.
func (r *Reloader) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch plugin folders: %w", err)
	}
	defer w.Close()
	files := map[string]bool{} // plugin files named directly
	for _, p := range r.opts.Paths {
		dir := p
		if info, err := os.Stat(p); err == nil && !info.IsDir() {
			dir = filepath.Dir(p)
			abs, _ := filepath.Abs(p)
			files[abs] = true
		}
		if err := w.Add(dir); err != nil {
			return fmt.Errorf("watch %s: %w (is it a folder you can read? --no-watch turns watching off)", dir, err)
		}
	}
	relevant := func(path string) bool {
		if abs, _ := filepath.Abs(path); files[abs] {
			return true
		}
		for _, p := range r.opts.Paths {
			if filepath.Clean(filepath.Dir(path)) == filepath.Clean(p) && IsPluginFile(filepath.Base(path)) {
				return true
			}
		}
		return false
	}
	var timer *time.Timer
	fire := make(chan struct{}, 1)
	written := false
	for {
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return nil
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			r.log.Warn("plugin folder watch", "error", err)
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if !relevant(ev.Name) {
				continue
			}
			if ev.Has(fsnotify.Write) {
				written = true
			}
			wait := r.opts.Settle
			if written {
				wait = r.opts.SettleWrite
			}
			if timer == nil {
				timer = time.AfterFunc(wait, func() {
					select {
					case fire <- struct{}{}:
					default:
					}
				})
			} else {
				timer.Reset(wait)
			}
		case <-fire:
			written = false
			if _, errs := r.Rescan(ctx); len(errs) > 0 {
				r.log.Debug("rescan finished with errors", "errors", len(errs))
			}
		}
	}
}

// Close closes every plugin served.
func (r *Reloader) Close(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cat == nil {
		return nil
	}
	err := r.cat.Close(ctx)
	r.cat = nil
	return err
}
