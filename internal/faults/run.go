package faults

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/durable"
)

// Scenario is one fault, injected into a fresh [Cluster] while the
// clients run.
type Scenario struct {
	Name  string
	Proxy Proxy
	// Slow: the clients call slownotes' slow_add (which works on after
	// changing its state, reporting progress), not the notes example.
	Slow bool
	// Relays, StoreLinks, Down, Sentinel, FileStore: see [Setup].
	Relays     bool
	StoreLinks bool
	Down       []int
	Sentinel   bool
	FileStore  bool
	// Resets: the fault may lose what the store held (its data gone or
	// evicted), so a stateReset is allowed; in every other scenario one
	// is a violation ([Resets]).
	Resets bool
	// SoakOnly: left out of the short run (FAULTS=short) unless FAULTS_RUN
	// names scenarios: a variant of a scenario the short run has, kept
	// for soaks to hold CI's time.
	SoakOnly bool
	// Attempt, if set, is the clients' attempt timeout in place of
	// Options.Attempt: longer than a proxy's own timeouts, so that the
	// proxy, not the client, gives up on a replica that does not answer
	// (and sends the request on, as its config says).
	Attempt time.Duration
	// Steps, if set, is slow_add's steps in place of Options.Steps: a
	// call long enough for a fault at its first progress report to land
	// while it runs.
	Steps int
	// Fault injects the fault and waits until the cluster is whole
	// again; the runner then waits for two more rounds of every client.
	Fault func(r *Run)
}

// Run is a scenario being run: its cluster, its clients, and the
// violations the scenario itself finds (a replica ready that must not
// be).
type Run struct {
	T       testing.TB
	C       *Cluster
	Clients []*Client

	mu         sync.Mutex
	violations []Violation
	progress   chan int      // clients that reported progress (Slow)
	round      chan struct{} // poked by each client's round
}

// Violate records a violation the scenario found.
func (r *Run) Violate(kind, detail string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, Violation{Kind: kind, Client: -1, Op: "scenario", At: time.Now(), Detail: detail})
}

// Rounds waits until every client has completed n more rounds (an add
// and a read, each retried until it succeeded or was given up) than it
// had when called. A client that is stuck gives up its operation after
// GiveUp, so this ends; it fails the test after 5 minutes.
func (r *Run) Rounds(n int) {
	r.T.Helper()
	want := make([]int64, len(r.Clients))
	for i, c := range r.Clients {
		want[i] = c.Rounds() + int64(n)
	}
	timeout := time.After(5 * time.Minute)
	for i, c := range r.Clients {
		for c.Rounds() < want[i] {
			select {
			case <-r.round: // some client finished a round
			case <-timeout:
				r.T.Fatalf("client %d made no progress for 5 minutes", c.N)
			}
		}
	}
}

// Progress returns the number of the next client to report progress on
// a slow call (after the calls before it were discarded with
// [Run.DrainProgress]). It fails the test after 2 minutes without one.
func (r *Run) Progress() int {
	r.T.Helper()
	select {
	case n := <-r.progress:
		return n
	case <-time.After(2 * time.Minute):
		r.T.Fatal("no slow call reported progress for 2 minutes")
		return -1
	}
}

// progressWithin is [Run.Progress] that gives up after d, reporting false.
func (r *Run) progressWithin(d time.Duration) (int, bool) {
	select {
	case n := <-r.progress:
		return n, true
	case <-time.After(d):
		return -1, false
	}
}

// DrainProgress discards progress reports so far.
func (r *Run) DrainProgress() {
	for {
		select {
		case <-r.progress:
		default:
			return
		}
	}
}

// ReplicaOf returns the index of the replica that minted client n's
// session (its ID's or handle's first field), -1 if none yet.
func (r *Run) ReplicaOf(n int) int {
	s := r.Clients[n].Session()
	name, _, _ := strings.Cut(s, ".")
	for i, rep := range r.C.Replicas {
		if rep.Name == name {
			return i
		}
	}
	return -1
}

// Hold waits d: the length of a fault (a replica stopped, Redis down).
func (r *Run) Hold(d time.Duration) {
	r.C.Logf("holding the fault %v", d)
	time.Sleep(d)
}

// Options tune [RunScenario].
type Options struct {
	Setup   Setup // Proxy, Relays, StoreLinks, Down, Sentinel are the scenario's
	PerEra  int   // clients of each era
	Tag     string
	Attempt time.Duration // ClientOptions.AttemptTimeout
	GiveUp  time.Duration
	Steps   int       // slow_add's steps
	Out     io.Writer // every violation and the timeline are written here
}

// Result is one scenario's outcome.
type Result struct {
	Scenario   string
	Proxy      Proxy
	Clients    int
	Stats      Stats
	Violations []Violation
	Took       time.Duration
}

// The workload's mix, by client number (clients alternate eras, even
// numbers 2025-11-25, odd 2026-07-28): of each six, clients 0 and 1 send an
// idempotency key with each add and use one plugin (the suite's clients
// before keyless and two-plugin ones were added), 2 and 3 send no key,
// 4 and 5 send keys and use two plugins in one session. From twelve
// clients on (a soak), 10 and 11 of each twelve use two plugins without
// keys. See [Check] for what each is promised.

// Keyless says whether client n sends no idempotency key.
func Keyless(n int) bool { return n%6 == 2 || n%6 == 3 || n%12 >= 10 }

// TwoPlugins says whether client n uses two stateful plugins in its
// session.
func TwoPlugins(n int) bool { return n%6 >= 4 }

// setup is what sc runs: base with the scenario's own fields.
func (sc Scenario) setup(base Setup) Setup {
	s := base
	s.Proxy, s.Relays, s.StoreLinks, s.Down, s.Sentinel = sc.Proxy, sc.Relays, sc.StoreLinks, sc.Down, sc.Sentinel
	s.FileStore = sc.FileStore
	return s
}

// RunScenario runs sc on a fresh cluster and checks every client's
// history.
func RunScenario(t testing.TB, sc Scenario, o Options) Result {
	start := time.Now()
	c := NewCluster(t, sc.setup(o.Setup))
	r := &Run{T: t, C: c, progress: make(chan int, 1024), round: make(chan struct{}, 1)}
	attempt := o.Attempt
	if sc.Attempt > 0 {
		attempt = sc.Attempt
	}
	copts := ClientOptions{AddTool: "note_add", ListTool: "note_list", AttemptTimeout: attempt, GiveUp: o.GiveUp,
		Round: func() {
			select {
			case r.round <- struct{}{}:
			default:
			}
		}}
	// A two-plugin client's second plugin: the other notepad, slownotes
	// (not contained: claimed before it runs) with no steps, or notes
	// (contained) in a Slow scenario.
	second := Tools{AddTool: "slow_add", ListTool: "slow_list", Args: map[string]any{"steps": 0}}
	if sc.Slow {
		copts.AddTool, copts.ListTool, copts.Steps = "slow_add", "slow_list", cmp.Or(sc.Steps, o.Steps)
		copts.Progress = func(n int, _ string) {
			select {
			case r.progress <- n:
			default:
			}
		}
		second = Tools{AddTool: "note_add", ListTool: "note_list"}
	}
	var mix []string
	for i := range 2 * o.PerEra {
		era := Legacy
		if i%2 == 1 {
			era = Modern
		}
		co := copts
		co.Keyless = Keyless(i)
		what := "keyed"
		if co.Keyless {
			what = "keyless"
		}
		if TwoPlugins(i) {
			co.Second = second
			what += ", " + co.AddTool + " and " + second.AddTool
		}
		mix = append(mix, fmt.Sprintf("c%d %s %s", i, era, what))
		r.Clients = append(r.Clients, NewClient(i, era, c.ProxyAddr, o.Tag+"."+sc.Name, co))
	}
	c.Logf("clients: %s", strings.Join(mix, "; "))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, cl := range r.Clients {
		wg.Go(func() { cl.Run(ctx, stop) })
	}
	r.Rounds(1)
	c.Logf("clients warm")
	sc.Fault(r)
	r.Rounds(2)
	close(stop)
	wg.Wait()
	c.Logf("clients stopped")
	c.storeBreakers()
	for _, cl := range r.Clients {
		// The client's notes before this are not expected after it.
		for _, at := range cl.Renewed() {
			c.Logf("client %d began a new session at %.2fs (%d notes in the last)", cl.N, c.Since(at).Seconds(), NotesPerSession)
		}
	}

	if sc.Attempt > 0 {
		// The attempts the proxy answered only after its own timeout
		// (15 s): those it sent on to a fallback, or gave up on.
		late := 0
		for _, cl := range r.Clients {
			for _, op := range cl.History() {
				if op.Kind != "session" && op.Kind != "renew" && op.End.Sub(op.Start) > 15*time.Second {
					late++
				}
			}
		}
		c.Logf("%d attempts took the proxy's timeout (15 s) or more", late)
	}
	res := Result{Scenario: sc.Name, Proxy: sc.Proxy, Clients: len(r.Clients), Stats: Stats{Notices: map[string]int{}, FailedBy: map[string]int{}}}
	res.Violations = append(res.Violations, r.violations...)
	for _, cl := range r.Clients {
		vs, st := Check(cl.History())
		res.Violations = append(res.Violations, vs...)
		if !sc.Resets {
			res.Violations = append(res.Violations, Resets(cl.History())...)
		}
		res.Stats.Ops += st.Ops
		res.Stats.Attempts += st.Attempts
		res.Stats.Failed += st.Failed
		res.Stats.Recovered += st.Recovered
		for k, n := range st.Notices {
			res.Stats.Notices[k] += n
		}
		for k, n := range st.FailedBy {
			res.Stats.FailedBy[k] += n
		}
	}
	res.Took = time.Since(start)
	if dir := os.Getenv("FAULTS_LOGDIR"); dir != "" {
		dumpHistories(t, filepath.Join(dir, strings.NewReplacer("/", "-").Replace(t.Name())+".histories.jsonl"), r.Clients, res.Violations)
	}
	if o.Out != nil {
		fmt.Fprintf(o.Out, "=== %s (%s): %d clients, %d ops, %d failed attempts, %d recovered, %d violations, %s\n",
			sc.Name, sc.Proxy, res.Clients, res.Stats.Ops, res.Stats.Failed, res.Stats.Recovered, len(res.Violations), res.Took.Round(time.Second))
		for _, e := range c.Timeline() {
			fmt.Fprintf(o.Out, "    %s\n", e)
		}
		for _, v := range res.Violations {
			fmt.Fprintf(o.Out, "  VIOLATION %s: client %d (%s) %s at %.2fs: %s\n", v.Kind, v.Client, v.Era, v.Op, c.Since(v.At).Seconds(), v.Detail)
		}
	}
	return res
}

// Table writes results as a Markdown table: one row per scenario, a
// column per violation kind.
func Table(w io.Writer, results []Result) {
	fmt.Fprintf(w, "| scenario | proxy | clients | ops | failed attempts | recovered | notices |")
	for _, k := range Kinds {
		fmt.Fprintf(w, " %s |", k)
	}
	fmt.Fprintf(w, " violations | time |\n|---|---|---|---|---|---|---|")
	for range Kinds {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w, "---|---|")
	for _, r := range results {
		counts := Counts(r.Violations)
		notices := SortedNotices(r.Stats.Notices)
		if notices == "" {
			notices = "-"
		}
		failed := fmt.Sprint(r.Stats.Failed)
		if by := SortedNotices(r.Stats.FailedBy); by != "" {
			failed += " (" + by + ")"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %s | %d | %s |", r.Scenario, r.Proxy, r.Clients, r.Stats.Ops, failed, r.Stats.Recovered, notices)
		for _, k := range Kinds {
			fmt.Fprintf(w, " %d |", counts[k])
		}
		fmt.Fprintf(w, " **%d** | %s |\n", len(r.Violations), r.Took.Round(time.Second))
	}
}

// storeBreakers adds to the timeline, for each replica whose store
// breaker opened, when and on what error (durable.BreakerOpened) and how
// many calls it then served from memory (durable.ServingFromMemory): the
// causes of the run's notSaved store-unavailable results, by replica,
// which the clients see only as a reason. (A run of sigstop-past-proxy
// had 358 with no store fault, untraced: a replica that was never
// stopped, whose exchange got no answer within its second on a machine
// out of CPU.)
func (c *Cluster) storeBreakers() {
	for _, r := range c.Replicas {
		var opened []string
		memory := 0
		for _, line := range strings.Split(r.Output(), "\n") {
			switch {
			case strings.Contains(line, durable.BreakerOpened):
				at := "?"
				if f, ok := logField(line, "time"); ok {
					if t, err := time.Parse(time.RFC3339Nano, f); err == nil {
						at = fmt.Sprintf("%.2fs", c.Since(t).Seconds())
					}
				}
				e, _ := logField(line, "error")
				opened = append(opened, at+" ("+e+")")
			case strings.Contains(line, durable.ServingFromMemory):
				memory++
			}
		}
		if len(opened) > 0 || memory > 0 {
			c.Logf("%s: store breaker opened %d× at %s; %d calls served from memory", r.Name, len(opened), strings.Join(opened, ", "), memory)
		}
	}
}

// logField is the value of key in a line of slog's text output, unquoted.
func logField(line, key string) (string, bool) {
	i := strings.Index(line, " "+key+"=")
	if i < 0 && strings.HasPrefix(line, key+"=") {
		i = -1
	} else if i < 0 {
		return "", false
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		q, err := strconv.QuotedPrefix(v)
		if err != nil {
			return "", false
		}
		u, err := strconv.Unquote(q)
		return u, err == nil
	}
	v, _, _ = strings.Cut(v, " ")
	return v, true
}

// dumpHistories writes, one JSON object a line, every attempt of each
// client that has a violation (FAULTS_LOGDIR): what the timeline of a
// violation is read from.
func dumpHistories(t testing.TB, path string, clients []*Client, vs []Violation) {
	bad := map[int]bool{}
	for _, v := range vs {
		bad[v.Client] = true
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for _, cl := range clients {
		if !bad[cl.N] {
			continue
		}
		for _, op := range cl.History() {
			if err := enc.Encode(op); err != nil {
				t.Log(err)
			}
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Log(err)
	}
}
