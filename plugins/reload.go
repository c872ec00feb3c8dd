package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/time/rate"

	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Plugin states in a [Status].
const (
	StateLoading = "loading" // read, being checked and compiled; an older version may be served
	StateLoaded  = "loaded"
	StateError   = "error"
	// StateRetrying: the load failed for a reason that may pass (a
	// [TransientError], said in Status.Error) and is tried again at
	// Status.RetryAt; an older version may be served meanwhile.
	StateRetrying = "retrying"
	StateDisabled = "disabled"
)

// Status is what the reloader knows of one plugin file.
type Status struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// SHA256 is the version served, "" when none is.
	SHA256 string `json:"sha256,omitempty"`
	// State is loading, loaded, error or retrying (Error says why; an
	// older version may still be served, see SHA256) or disabled.
	State string   `json:"state"`
	Error string   `json:"error,omitempty"`
	Tools []string `json:"tools"`
	// LastReload is when the file was last read, successfully or not.
	LastReload time.Time `json:"lastReload"`
	// RetryAt is when a retrying load is tried again.
	RetryAt time.Time `json:"retryAt,omitzero"`
}

// Swap is one change of the served catalogue, handed to the function set
// with [Reloader.OnSwap].
type Swap struct {
	Next *Catalogue
	// Replaced maps each plugin no longer served to the plugin that
	// replaces it (same name, new code); Removed lists those with none.
	// The receiver owns them: it retires their instances and closes each
	// once no call runs on it.
	Replaced map[*Plugin]*Plugin
	Removed  []*Plugin
	// Relisted maps a plugin to the plugin with the same code and the
	// lists its guest gave again (see [Reloader.Relist]). Nothing is
	// retired: instances of one serve the other, and neither is closed.
	Relisted map[*Plugin]*Plugin
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
	// LoadConcurrency bounds the files loaded at once by a rescan; 0 means
	// 8. More than the cores on purpose: a load that spins (a start
	// function or a list export that never returns, until the load
	// deadline) must not hold a good plugin's load behind it, and the Go
	// scheduler shares the cores among them.
	LoadConcurrency int
	// SlowLoad is how long a file's guest code may run at load (its start
	// function and its lists, after it compiled) in the first pass of a
	// rescan: a load that runs longer is stopped (a spinning guest would
	// take the cores from the others) and done again, with the plugin's
	// whole load timeout, once the other files are in; it holds neither
	// a place of LoadConcurrency nor the settling (OnSettled) meanwhile.
	// 0 means [DefaultSlowLoad].
	SlowLoad time.Duration
	// OnSettled, if set, is called once, when every file of the first
	// rescan has loaded, failed or been found slow: what a client's first
	// list waits for. The slow ones are served later, if their second
	// load succeeds, with the usual swap (list_changed).
	OnSettled func()
	// RetryMin and RetryMax bound the backoff of a load that failed for a
	// reason that may pass (a [TransientError]): it is tried again after
	// RetryMin, then after twice as long at each failure, up to RetryMax,
	// until it loads, fails for good, or its file or the configuration
	// changes (which starts afresh). Defaults: [DefaultRetryMin] and
	// [DefaultRetryMax].
	RetryMin, RetryMax time.Duration
	// RetryAttempts is how many times in a row such a load may fail
	// before it is given up until the file or the configuration
	// changes. Default: [DefaultRetryAttempts].
	RetryAttempts int
}

// DefaultSlowLoad is ReloaderOptions.SlowLoad's default: a plugin's
// start function and lists run in milliseconds; one that spins is not
// waited for beyond this.
const DefaultSlowLoad = 500 * time.Millisecond

// Reloader keeps a catalogue in step with plugin folders: it loads what
// appears, swaps in what changes, drops what disappears, and keeps serving
// the old version of a plugin whose new version is bad. It is safe for
// concurrent use.
type Reloader struct {
	rt   *sandbox.Runtime
	opts ReloaderOptions
	log  *slog.Logger

	settled func()     // OnSettled, once
	scan    sync.Mutex // one rescan at a time
	mu      sync.Mutex // serialises every change of the catalogue and guards what follows
	gen     int        // bumped by Reconfigure: every file is read again
	cat     *Catalogue
	files   map[string]*fileState // by path
	onSwap  func(ctx context.Context, s Swap)
	relists map[string]*rate.Limiter // by plugin name
	// relistLater holds, by plugin name, the relist RelistFresh put off
	// (Close stops them); relistBusy names the plugins whose relist from
	// a new instance runs, relistWG counts them (Close waits for them);
	// closing refuses new ones.
	relistLater map[string]*time.Timer
	relistBusy  map[string]bool
	relistWG    sync.WaitGroup
	closing     bool
	// retries counts the rescans of due retries under way (Close waits
	// for them); ctx is theirs, cancelled by Close.
	retries sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
}

type fileState struct {
	plugin  *Plugin // the version served, nil if none
	status  Status
	lastBad string // sha256 of the last bytes refused
	// collided says lastBad was refused for a name another plugin held:
	// tried again once a plugin goes or changes.
	collided bool
	gen      int // the configuration generation of the last load begun
	// servedGen is the configuration generation plugin was loaded under:
	// older than gen while a load under a new configuration runs, and
	// after one that failed (then plugin is dropped: see loadIfChanged).
	servedGen int
	retry     *retry // the load tried again after a transient failure
}

// NewReloader returns a reloader of the given paths. Call Load, then
// Watch.
func NewReloader(rt *sandbox.Runtime, opts ReloaderOptions) *Reloader {
	r := &Reloader{rt: rt, opts: opts, log: opts.Logger, files: map[string]*fileState{}, relists: map[string]*rate.Limiter{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.cat, _ = NewCatalogue(nil)
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.opts.Settle <= 0 {
		r.opts.Settle = 25 * time.Millisecond
	}
	if r.opts.SettleWrite <= 0 {
		r.opts.SettleWrite = 250 * time.Millisecond
	}
	if r.opts.LoadConcurrency <= 0 {
		r.opts.LoadConcurrency = 8
	}
	if r.opts.SlowLoad <= 0 {
		r.opts.SlowLoad = DefaultSlowLoad
	}
	if r.opts.RetryMin <= 0 {
		r.opts.RetryMin = DefaultRetryMin
	}
	if r.opts.RetryMax <= 0 {
		r.opts.RetryMax = DefaultRetryMax
	}
	r.opts.RetryMax = max(r.opts.RetryMax, r.opts.RetryMin)
	if r.opts.RetryAttempts <= 0 {
		r.opts.RetryAttempts = DefaultRetryAttempts
	}
	if r.opts.OnSettled != nil {
		r.settled = sync.OnceFunc(r.opts.OnSettled)
	} else {
		r.settled = func() {}
	}
	return r
}

// NewStatic returns a reloader that serves cat and follows no files: only
// guest relists ([Reloader.Relist]) change what it serves. It is what a
// host is given when its catalogue comes from [LoadAll].
func NewStatic(cat *Catalogue) *Reloader {
	r := NewReloader(nil, ReloaderOptions{})
	r.cat = cat
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

// Follow is OnSwap for a receiver that starts serving now: f is called at
// once, under the same lock, with a Swap holding only the catalogue served
// now (if any), then with every change.
func (r *Reloader) Follow(f func(ctx context.Context, s Swap)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onSwap = f
	if r.cat != nil {
		f(context.Background(), Swap{Next: r.cat})
	}
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
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Path, b.Path) })
	return out
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
// difference: deleted (and disabled) files are dropped at once, then new
// and changed files (by sha256) are loaded in parallel, at most
// [ReloaderOptions.LoadConcurrency] at a time, and each is served as soon
// as it is checked, loaded and found not to collide, so a slow or
// hostile file never delays the others. Two new files that claim the
// same name in one rescan: the first in the paths' order wins, whichever
// loads first (the other may serve until it does), so that which code
// answers a name does not change from one start to the next. Rescan reports whether
// the catalogue changed, and the errors of files that failed (their old
// versions, if any, still served). One rescan runs at a time.
func (r *Reloader) Rescan(ctx context.Context) (bool, []error) {
	ctx, span := telemetry.Start(ctx, "wasmtools.reload")
	defer span.End()
	r.scan.Lock()
	defer r.scan.Unlock()
	files, errs := Discover(r.opts.Paths)

	r.mu.Lock()
	if r.cat == nil || r.closing {
		r.mu.Unlock()
		return false, errs
	}
	var present []string
	isPresent := map[string]bool{}
	for _, path := range files {
		if r.disabled(path) {
			continue // as if absent: a served version is dropped
		}
		present = append(present, path)
		isPresent[path] = true
	}
	gone := map[*Plugin]bool{}
	for path, f := range r.files {
		if isPresent[path] || f.status.State == StateDisabled {
			continue
		}
		if f.plugin != nil {
			gone[f.plugin] = true
		}
		r.log.Info("plugin removed", "path", path)
		r.stopRetryLocked(f)
		delete(r.files, path)
	}
	for _, path := range files {
		if r.disabled(path) {
			if f := r.files[path]; f != nil {
				if f.plugin != nil {
					gone[f.plugin] = true
				}
				r.stopRetryLocked(f)
			}
			r.files[path] = &fileState{status: Status{Name: pluginName(path), Path: path, State: StateDisabled, Tools: []string{}, LastReload: time.Now()}}
		}
	}
	changed := len(gone) > 0
	if changed {
		next, _ := r.cat.next(nil, nil, gone) // removals refuse nothing
		swap := Swap{Next: next}
		for p := range gone {
			swap.Removed = append(swap.Removed, p)
		}
		r.swapLocked(ctx, swap)
	}
	r.mu.Unlock()

	order := &scanOrder{rank: map[string]int{}, added: map[*Plugin]bool{}}
	for i, path := range present {
		order.rank[path] = i
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, r.opts.LoadConcurrency)
	// pending counts the files not yet loaded, failed or found slow; at 0
	// the first load has settled.
	var pending atomic.Int64
	pending.Store(int64(len(present)) + 1)
	settle := func() {
		if pending.Add(-1) == 0 {
			r.settled()
		}
	}
	// A load whose guest code runs past SlowLoad is stopped (it would
	// take the cores from the others) and tried again, with its whole
	// load timeout, once the rest are in.
	var slowPaths []string
	load := func(path string, bounded bool, done func()) {
		defer done()
		lctx, stop := context.WithCancelCause(ctx)
		defer stop(nil)
		var slow *time.Timer
		var compiled func()
		if bounded {
			compiled = func() {
				slow = time.AfterFunc(r.opts.SlowLoad, func() {
					r.log.Warn("plugin slow to load: stopped, and loaded again once the others are in", "path", path, "after", r.opts.SlowLoad)
					stop(errSlowLoad)
				})
			}
		}
		p, err := r.loadIfChanged(lctx, path, compiled)
		if slow != nil {
			slow.Stop()
		}
		if errors.Is(err, errSlowLoad) {
			mu.Lock()
			slowPaths = append(slowPaths, path)
			mu.Unlock()
			return
		}
		if err == nil && p != nil {
			err = r.apply(ctx, p, order)
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
		} else if p != nil {
			changed = true
		}
	}
	for _, path := range present {
		sem <- struct{}{}
		wg.Go(func() { load(path, true, func() { <-sem; settle() }) })
	}
	settle()
	wg.Wait()
	for _, path := range slowPaths {
		sem <- struct{}{}
		wg.Go(func() { load(path, false, func() { <-sem }) })
	}
	wg.Wait()
	// A file displaced for an earlier one may have held a name another
	// file of this rescan was refused for: that file is loaded again now,
	// not at some later rescan, so that the paths' order alone decides
	// (a takes b's name, b had taken c's: c is served). Each round serves
	// earlier files in later ones' place, so the rounds end.
	for range present {
		retry := order.takeRetry(r)
		if len(retry) == 0 {
			break
		}
		for _, path := range retry {
			sem <- struct{}{}
			wg.Go(func() { load(path, false, func() { <-sem }) })
		}
		wg.Wait()
	}
	return changed, errs
}

// errSlowLoad stops a load that ran past ReloaderOptions.SlowLoad.
var errSlowLoad = errors.New("slow load: tried again later")

// scanOrder is what a rescan knows of the order of its files: each
// present file's rank (Discover's order), and the plugins of new files it
// served. The reloader's lock guards added.
type scanOrder struct {
	rank  map[string]int
	added map[*Plugin]bool
	// retry are the present files refused for a name that a plugin
	// displaced by an earlier file held: loaded again in this rescan.
	retry []string
}

// takeRetry returns and forgets the files to load again.
func (o *scanOrder) takeRetry(r *Reloader) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := o.retry
	o.retry = nil
	return out
}

// apply serves p, a new file's plugin or a served file's new version, if
// it claims no name another served plugin holds (see Catalogue.next); else
// it refuses p, closes it, and the version it would replace goes on. The
// one exception keeps a start deterministic: a new file whose names are
// held only by new files of the same rescan (order) that come after it
// takes the names from them, and they are refused instead.
func (r *Reloader) apply(ctx context.Context, p *Plugin, order *scanOrder) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.files[p.Path()]
	if r.cat == nil || f == nil || f.status.State == StateDisabled {
		// The reloader closed while p loaded (a rescan of POST /reload
		// or the watcher outlasting shutdown), or the file went away.
		_ = p.Close(ctx)
		return nil
	}
	var next *Catalogue
	var rejected []Rejected
	old := f.plugin
	if old != nil {
		next, rejected = r.cat.next(map[*Plugin]*Plugin{old: p}, nil, nil)
	} else {
		next, rejected = r.cat.next(nil, []*Plugin{p}, nil)
	}
	var displaced []*Plugin
	if len(rejected) > 0 && old == nil {
		if later := r.laterHoldersLocked(p, order); len(later) > 0 {
			remove := map[*Plugin]bool{}
			for _, h := range later {
				remove[h] = true
			}
			if n, rej := r.cat.next(nil, []*Plugin{p}, remove); len(rej) == 0 {
				next, rejected, displaced = n, nil, later
			}
		}
	}
	if len(rejected) > 0 {
		err := rejected[0].Err
		// Refused until a plugin goes or changes (swapLocked), which
		// may free the name: not loaded again on every rescan.
		f.lastBad, f.collided = p.SHA256(), true
		r.stopRetryLocked(f)
		f.status.State, f.status.Error = StateError, err.Error()
		r.log.Error("plugin version refused", "path", p.Path(), "error", err)
		_ = p.Close(ctx)
		return err
	}
	f.plugin, f.servedGen = p, f.gen
	r.stopRetryLocked(f)
	f.status.SHA256 = p.SHA256()
	f.status.State, f.status.Error = StateLoaded, ""
	f.status.Tools = toolNames(p)
	r.log.Info("plugin loaded", "plugin", p.Name(), "path", p.Path(), "sha256", p.SHA256(), "tools", len(p.Tools()))
	if old == nil && order != nil {
		order.added[p] = true
	}
	if len(displaced) > 0 && order != nil {
		// The swap has every collided file retried; those of this rescan
		// were loaded already, and are loaded again once its loads end.
		for path, cf := range r.files {
			if _, ok := order.rank[path]; ok && cf.collided && !slices.Contains(order.retry, path) {
				order.retry = append(order.retry, path)
			}
		}
	}
	swap := Swap{Next: next, Removed: displaced}
	if old != nil {
		swap.Replaced = map[*Plugin]*Plugin{old: p}
	}
	r.swapLocked(ctx, swap)
	// After the swap, which has the collided retried: these stay refused
	// until a plugin goes or changes.
	for _, h := range displaced {
		hf := r.files[h.Path()]
		if hf == nil || hf.plugin != h {
			continue
		}
		err := fmt.Errorf("plugin %q (%s): a name it claims is served by plugin %q (%s), which comes first in the served paths' order: rename one file or give one plugin a prefix", h.Name(), h.Path(), p.Name(), p.Path())
		hf.plugin = nil
		hf.lastBad, hf.collided = h.SHA256(), true
		r.stopRetryLocked(hf)
		hf.status.SHA256, hf.status.Tools = "", []string{}
		hf.status.State, hf.status.Error = StateError, err.Error()
		r.log.Error("plugin version refused", "path", h.Path(), "error", err)
	}
	return nil
}

// laterHoldersLocked returns the served plugins holding names p claims
// when every one of them is a new file of the same rescan that comes after
// p's file (nil otherwise). The caller holds r.mu.
func (r *Reloader) laterHoldersLocked(p *Plugin, order *scanOrder) []*Plugin {
	if order == nil {
		return nil
	}
	mine, ok := order.rank[p.Path()]
	if !ok {
		return nil
	}
	want := map[claim]bool{}
	for _, cl := range claims(p) {
		want[cl] = true
	}
	var holders []*Plugin
	for _, q := range r.cat.plugins {
		if !slices.ContainsFunc(claims(q), func(cl claim) bool { return want[cl] }) {
			continue
		}
		if rank, ok := order.rank[q.Path()]; !ok || !order.added[q] || rank <= mine {
			return nil
		}
		holders = append(holders, q)
	}
	return holders
}

// retryCollidedLocked has the next rescan load again the versions refused
// for a name another plugin held: the catalogue changed, and the name may
// be free. The caller holds r.mu.
func (r *Reloader) retryCollidedLocked() {
	for _, f := range r.files {
		if f.collided {
			f.lastBad, f.collided = "", false
		}
	}
}

// swapLocked serves s.Next and hands the swap to OnSwap's function, or
// closes the plugins it retires when there is none. The caller holds r.mu.
func (r *Reloader) swapLocked(ctx context.Context, s Swap) {
	r.cat = s.Next
	if len(s.Removed) > 0 || len(s.Replaced) > 0 {
		r.retryCollidedLocked()
	}
	if r.onSwap != nil {
		r.onSwap(ctx, s)
		return
	}
	for old := range s.Replaced {
		_ = old.Close(ctx)
	}
	for _, old := range s.Removed {
		_ = old.Close(ctx)
	}
}

// Relist limits: a plugin's guest may have its lists read again this
// often, after a burst. A relist runs guest code and may notify every
// client, so a guest must not be able to do it on every call.
const (
	RelistBurst    = 5
	RelistInterval = time.Second
)

// Errors of [Reloader.Relist].
var (
	// ErrRelistLimited: the plugin asked for relists faster than
	// [RelistBurst] and [RelistInterval] allow; this one was dropped.
	ErrRelistLimited = errors.New("tool list changes reported too often: this one was ignored")
	// ErrNotServed: the instance's plugin is no longer served (it was
	// replaced or removed meanwhile); its list is not read.
	ErrNotServed = errors.New("plugin version no longer served")
)

// Relist reads the lists (tools, prompts, resources, templates) of the
// plugin again from inst, whose guest said they changed, and serves them.
// The caller holds inst. The guest runs outside the reloader's lock; the
// result is applied only if inst's plugin is still the version served
// (compare and swap), and through the same rule as a reload: a list that
// claims another plugin's names is refused whole, with an error naming
// both, and the old lists stay. A list that changed nothing changes
// nothing, so no client is notified.
func (r *Reloader) Relist(ctx context.Context, inst *Instance) error {
	p := inst.Plugin()
	cur, lim := r.relistOf(p)
	if cur == nil {
		return fmt.Errorf("plugin %q: %w", p.Name(), ErrNotServed)
	}
	if !lim.Allow() {
		return fmt.Errorf("plugin %q: %w", p.Name(), ErrRelistLimited)
	}
	return r.relist(ctx, p, cur, inst)
}

// RelistFresh is Relist from a new instance of p's version served, made
// for it and closed after: the lists as the plugin's code gives them,
// apart from what any client's calls did to its own instance. It is for a
// host whose clients are not all trusted alike (tenants): from the
// calling instance, one tenant's session state set the tools every other
// tenant was listed and told of (a review: alice's tool, added in her
// session, listed to bob; or a tool of everyone's dropped). Relists past
// the rate are not dropped but folded into one, run once the rate allows:
// it reads the same lists whoever asked, so that one tenant's asking
// often never keeps another's change from being served.
func (r *Reloader) RelistFresh(ctx context.Context, p *Plugin) error {
	cur, lim := r.relistOf(p)
	if cur == nil {
		return fmt.Errorf("plugin %q: %w", p.Name(), ErrNotServed)
	}
	if !r.startRelist(p, lim) {
		return nil // put off: one is due, and will read these lists
	}
	defer r.endRelist(p)
	return r.relistNew(ctx, p, cur)
}

// startRelist reports whether a relist of p from a new instance may start
// now: none of p's is running (one at a time, so that a plugin's relists
// hold at most one instance beside the session layer's bounds), the rate
// allows it, and the reloader is not closing. Else it makes sure one is
// due later (relistDue) and reports false. A true must be followed by
// endRelist.
func (r *Reloader) startRelist(p *Plugin, lim *rate.Limiter) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing || r.cat == nil {
		return false
	}
	if !r.relistBusy[p.Name()] && lim.Allow() {
		if r.relistBusy == nil {
			r.relistBusy = map[string]bool{}
		}
		r.relistBusy[p.Name()] = true
		r.relistWG.Add(1)
		return true
	}
	if r.relistLater[p.Name()] == nil {
		if r.relistLater == nil {
			r.relistLater = map[string]*time.Timer{}
		}
		wait := max(lim.Reserve().Delay(), RelistInterval/10)
		r.relistLater[p.Name()] = time.AfterFunc(wait, func() { r.relistDue(p, lim) })
	}
	return false
}

// endRelist ends what startRelist started.
func (r *Reloader) endRelist(p *Plugin) {
	r.mu.Lock()
	delete(r.relistBusy, p.Name())
	r.mu.Unlock()
	r.relistWG.Done()
}

// relistDue runs the relist of p that startRelist put off, or puts it
// off again while another of p's runs.
func (r *Reloader) relistDue(p *Plugin, lim *rate.Limiter) {
	r.mu.Lock()
	delete(r.relistLater, p.Name())
	cur := r.servedLocked(p)
	busy := r.relistBusy[p.Name()]
	r.mu.Unlock()
	if cur == nil {
		return
	}
	if busy {
		// Due again later; or, if the other ended meanwhile and the rate
		// allows, now: startRelist then counts it, and it must end.
		if !r.startRelist(p, lim) {
			return
		}
	} else {
		r.mu.Lock()
		if r.closing || r.relistBusy[p.Name()] {
			r.mu.Unlock()
			return
		}
		if r.relistBusy == nil {
			r.relistBusy = map[string]bool{}
		}
		r.relistBusy[p.Name()] = true // its token was reserved when it was put off
		r.relistWG.Add(1)
		r.mu.Unlock()
	}
	defer r.endRelist(p)
	ctx, cancel := context.WithTimeout(context.Background(), relistLaterTimeout)
	defer cancel()
	if err := r.relistNew(ctx, p, cur); err != nil {
		r.log.Warn("plugin lists not read again", "plugin", p.Name(), "error", err)
	}
}

// relistLaterTimeout bounds a relist RelistFresh put off (the plugin's
// load timeout bounds its guest too).
const relistLaterTimeout = time.Minute

// relistNew relists cur (p's version served) from a new instance.
func (r *Reloader) relistNew(ctx context.Context, p, cur *Plugin) error {
	inst, err := cur.NewInstance(ctx)
	if err != nil {
		return err
	}
	defer inst.Close(context.Background())
	return r.relist(ctx, p, cur, inst)
}

// relistOf returns the version of p served (nil if none) and the limiter
// of p's relists.
func (r *Reloader) relistOf(p *Plugin) (*Plugin, *rate.Limiter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lim := r.relists[p.Name()]
	if lim == nil {
		lim = rate.NewLimiter(rate.Every(RelistInterval), RelistBurst)
		r.relists[p.Name()] = lim
	}
	return r.servedLocked(p), lim
}

// relist reads cur's lists from inst and serves them, as Relist says.
func (r *Reloader) relist(ctx context.Context, p, cur *Plugin, inst *Instance) error {
	fresh, err := cur.Relist(ctx, inst)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.servedLocked(p) != cur {
		return fmt.Errorf("plugin %q: %w", p.Name(), ErrNotServed)
	}
	if fresh.sameLists(cur) {
		return nil
	}
	next, rejected := r.cat.next(map[*Plugin]*Plugin{cur: fresh}, nil, nil)
	if len(rejected) > 0 {
		return rejected[0].Err
	}
	r.cat = next
	r.retryCollidedLocked() // the new lists may free a name
	if f := r.files[cur.Path()]; f != nil && f.plugin == cur {
		f.plugin = fresh
		f.status.Tools = toolNames(fresh)
	}
	r.log.Info("plugin lists read again", "plugin", p.Name(), "tools", len(fresh.Tools()))
	if r.onSwap != nil {
		r.onSwap(ctx, Swap{Next: next, Relisted: map[*Plugin]*Plugin{cur: fresh}})
	}
	return nil
}

// servedLocked returns the served plugin with p's name and code, or nil.
func (r *Reloader) servedLocked(p *Plugin) *Plugin {
	if r.cat == nil {
		return nil
	}
	for _, q := range r.cat.plugins {
		if q.name == p.name && q.SameCode(p) {
			return q
		}
	}
	return nil
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
// nothing changed. It runs outside r.mu, taking it only to read and record
// the file's state.
func (r *Reloader) loadIfChanged(ctx context.Context, path string, compiled func()) (*Plugin, error) {
	r.mu.Lock()
	maxSize := maxFileSize(r.opts.OptionsFor, path)
	r.mu.Unlock()
	wasm, err := readPluginFile(path, maxSize)
	if readHook != nil {
		if herr := readHook(path); herr != nil {
			wasm, err = nil, herr
		}
	}
	r.mu.Lock()
	f, ok := r.files[path]
	if !ok {
		f = &fileState{status: Status{Name: pluginName(path), Path: path, Tools: []string{}}}
		r.files[path] = f
	}
	if err != nil {
		defer r.mu.Unlock()
		f.status.LastReload = time.Now()
		r.dropStaleLocked(ctx, f, r.gen)
		return nil, r.failLocked(f, "", transientRead(fmt.Errorf("plugin file %s: %w", path, err)))
	}
	sum := sha256.Sum256(wasm)
	sha := hex.EncodeToString(sum[:])
	if f.plugin != nil && f.plugin.SHA256() == sha && f.servedGen == r.gen {
		if f.status.State == StateError || f.status.State == StateRetrying {
			// The file is the version served again, after a version
			// that was refused: its status says so.
			f.status.State, f.status.Error = StateLoaded, ""
			f.lastBad, f.collided = "", false
			r.stopRetryLocked(f)
		}
		r.mu.Unlock()
		return nil, nil // served
	}
	if f.lastBad == sha && f.gen == r.gen {
		r.mu.Unlock()
		return nil, nil // the same bad bytes again: already reported (or a retry is due later)
	}
	if rt := f.retry; rt != nil && (rt.sha != sha || rt.gen != r.gen) {
		r.stopRetryLocked(f) // another version or configuration: its own attempts
	}
	f.status.LastReload = time.Now()
	f.gen = r.gen
	if f.plugin == nil && f.retry == nil { // a retry says retrying until it ends
		f.status.State = StateLoading
	}
	check := r.opts.Check
	var opts Options
	if r.opts.OptionsFor != nil {
		opts = r.opts.OptionsFor(path)
	}
	r.mu.Unlock()
	refuse := func(err error) (*Plugin, error) {
		if errors.Is(context.Cause(ctx), errSlowLoad) {
			return nil, errSlowLoad // not refused: loaded again
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		f.lastBad = sha
		r.dropStaleLocked(ctx, f, f.gen)
		return nil, r.failLocked(f, sha, err)
	}
	if check != nil {
		if err := check(path, wasm); err != nil {
			return refuse(fmt.Errorf("plugin %q (%s): %w", f.status.Name, path, err))
		}
	}
	p, err := load(ctx, r.rt, path, wasm, opts, compiled)
	if err != nil {
		return refuse(transientLoad(ctx, err))
	}
	return p, nil
}

// dropStaleLocked stops serving f's plugin if it was loaded under a
// configuration older than gen, whose load of the file failed: that
// configuration no longer holds (its grants, limits and pin may have been
// taken back), and the plugin is not served under settings the
// configuration in force refuses. A failure that may pass has it loaded
// again under the configuration in force (see failLocked). The caller
// holds r.mu.
func (r *Reloader) dropStaleLocked(ctx context.Context, f *fileState, gen int) {
	old := f.plugin
	if old == nil || f.servedGen == gen || r.cat == nil {
		return
	}
	next, _ := r.cat.next(nil, nil, map[*Plugin]bool{old: true})
	f.plugin = nil
	f.status.SHA256, f.status.Tools = "", []string{}
	r.log.Error("plugin not served: it cannot be loaded under the new configuration, and the version served was loaded under the old one", "path", f.status.Path, "sha256", old.SHA256())
	r.swapLocked(context.WithoutCancel(ctx), Swap{Next: next, Removed: []*Plugin{old}})
}

func (r *Reloader) fail(f *fileState, err error) error {
	f.status.State, f.status.Error = StateError, err.Error()
	if errors.Is(err, context.Canceled) {
		// Its rescan was called off (the server stopping): nothing is
		// wrong with the file.
		r.log.Info("plugin load stopped before it ended", "path", f.status.Path, "error", err)
		return err
	}
	if f.plugin != nil {
		r.log.Error("plugin version refused: the old version goes on serving", "path", f.status.Path, "sha256", f.plugin.SHA256(), "error", err)
	} else {
		r.log.Error("plugin not loaded", "path", f.status.Path, "error", err)
	}
	return err
}

// readHook, when set, is called as a plugin file is read: its error, if
// any, is the read's (an I/O error a test cannot cause otherwise). Nil in
// production.
var readHook func(path string) error

// watchHook, when set, is called as Watch begins, before its watches are
// set up: a test's change that no event will report. Nil in production.
var watchHook func()

// K8sDataLink is the link Kubernetes' atomic writer replaces to update a
// volume's files at once (pkg/volume/util/atomic_writer.go): a watcher of
// a file in such a volume hears of a change only as an event on it.
const K8sDataLink = "..data"

func pluginName(path string) string {
	base := filepath.Base(path)
	return base[:len(base)-len(filepath.Ext(base))]
}

// Watch follows the plugin folders (and the folders of plugin files given
// by name) until ctx ends, rescanning once the files that changed have
// settled. One rescan follows a burst of events, whatever their number,
// and one follows the start of the watch (a change made since the first
// load read the folders gives no event).
//
// Two ways of deploying by swapping a symbolic link are followed too:
//   - a path served that is itself a link to a folder (git-sync's --link,
//     a "current" link moved to a release): its parent is watched, and
//     when the link is replaced the watch moves to its new target;
//   - Kubernetes' atomic writer (ConfigMap, Secret and projected volumes),
//     which points each file at "..data/NAME" and replaces the "..data"
//     link: a change of "..data" in a watched folder rescans it.
func (r *Reloader) Watch(ctx context.Context) error {
	if watchHook != nil {
		watchHook()
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch plugin folders: %w", err)
	}
	defer w.Close()
	files := map[string]bool{} // plugin files named directly
	dirs := map[string]bool{}  // folders watched: true for a folder served
	links := map[string]bool{} // paths served that are links to folders
	watching := 0
	for _, p := range r.opts.Paths {
		// Cleaned: "current/" (a shell's completion) is lstat'ed through
		// the link, and would not be taken for one.
		dir, served := filepath.Clean(p), true
		if info, err := os.Stat(p); err == nil && !info.IsDir() {
			dir, served = filepath.Dir(p), false
			abs, _ := filepath.Abs(p)
			files[abs] = true
		} else if l, err := os.Lstat(dir); err == nil && l.Mode()&fs.ModeSymlink != 0 {
			parent := filepath.Dir(dir)
			if err := w.Add(parent); err != nil {
				r.log.Warn("plugin folder not followed when its link moves", "path", p, "error", err)
			} else {
				links[filepath.Clean(p)] = true
			}
		}
		// A path that cannot be watched (missing, unreadable) is said
		// and skipped: the others are still followed.
		if err := w.Add(dir); err != nil {
			if links[dir] {
				// A link to a folder not there yet: followed once it is
				// (its parent is watched).
				r.log.Warn("plugin folder not watched until its link points at one", "path", p, "error", err)
				watching++
				continue
			}
			r.log.Warn("plugin path not watched: changes to it are not followed (POST /reload or SIGHUP rescans)", "path", p, "error", err)
			continue
		}
		dirs[filepath.Clean(dir)] = dirs[filepath.Clean(dir)] || served
		watching++
	}
	if watching == 0 && len(r.opts.Paths) > 0 {
		return fmt.Errorf("watch plugin paths: none of %s can be watched (is each a folder you can read? --no-watch turns watching off)", strings.Join(r.opts.Paths, ", "))
	}
	relevant := func(path string) bool {
		if abs, _ := filepath.Abs(path); files[abs] {
			return true
		}
		clean := filepath.Clean(path)
		if links[clean] {
			// The link was replaced: the watch follows it to its new
			// target (the old one's went with it, or goes now).
			_ = w.Remove(clean)
			if err := w.Add(clean); err != nil {
				r.log.Warn("plugin folder watch: the link's new target", "path", clean, "error", err)
			} else {
				dirs[clean] = true // a folder served, if it was not watchable at start
			}
			return true
		}
		served, watched := dirs[filepath.Dir(clean)]
		return watched && filepath.Base(clean) == K8sDataLink ||
			served && IsPluginFile(filepath.Base(clean))
	}
	fire := make(chan struct{}, 1)
	// A change made after the first load read the folders and before
	// they were watched gives no event: one rescan once they are.
	timer := time.AfterFunc(r.opts.Settle, func() {
		select {
		case fire <- struct{}{}:
		default:
		}
	})
	written := false
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
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
			timer.Reset(wait)
		case <-fire:
			written = false
			if _, errs := r.Rescan(ctx); len(errs) > 0 {
				r.log.Debug("rescan finished with errors", "errors", len(errs))
			}
		}
	}
}

// Close stops the retries of loads that failed for a reason that may
// pass, waits for a retry's rescan under way (its loads are called off,
// but a compilation is only bounded), and closes every plugin served.
func (r *Reloader) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closing = true
	for name, t := range r.relistLater {
		t.Stop()
		delete(r.relistLater, name)
	}
	for _, f := range r.files {
		r.stopRetryLocked(f)
	}
	r.cancel()
	r.mu.Unlock()
	r.retries.Wait()
	r.relistWG.Wait() // a relist from a new instance uses the plugins closed below
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cat == nil {
		return nil
	}
	err := r.cat.Close(ctx)
	r.cat = nil
	return err
}
