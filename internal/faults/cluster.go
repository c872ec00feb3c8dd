// Package faults is the fault suite of durable sessions (issue 25): it
// runs real processes on 127.0.0.1 as docs/DEPLOY.md deploys them (three
// `wasmtools serve --http --replica` replicas sharing a redis-server
// without persistence, behind HAProxy or nginx with the configs of deploy/
// unchanged), injects faults into them (kill -9, SIGSTOP, SIGTERM, Redis
// restarted empty, stopped or frozen, a replica cut off from Redis, the
// proxy killed and started again, a
// replica with another state key, a Redis primary failed over by
// Sentinel to a replica that may lack its last writes),
// while clients of both protocol eras add numbered notes and read them
// back, and a checker ([Check]) compares what each client was told with
// what it read, as Jepsen does for databases.
//
// It is for tests only (its functions take a testing.TB); the suite itself
// is TestFaults, run by `make faults` (see docs/DEPLOY.md, "Faults").
package faults

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// StateKey and Token are what every replica of the suite shares, exported
// as docs/DEPLOY.md says (WASMTOOLS_STATE_KEY, WASMTOOLS_AUTH_TOKEN).
const (
	StateKey = "the state key every replica of the fault suite shares"
	Token    = "fault-suite-bearer-token-0123456789"
)

// ReadyTimeout bounds a replica's start: compiling its plugins on a
// loaded 2-core machine, the first time, takes long.
const ReadyTimeout = 2 * time.Minute

// Proxy names a proxy config of deploy/.
type Proxy string

const (
	HAProxy Proxy = "haproxy"
	Nginx   Proxy = "nginx"
	// Direct is no proxy: the clients connect to the first replica (its
	// relay, with Setup.Relays), as to one machine's server.
	Direct Proxy = "direct"
)

// Setup is what a [Cluster] runs.
type Setup struct {
	Binary   string // the wasmtools binary
	Plugins  string // the plugin folder every replica serves
	CacheDir string // the compilation cache the replicas share
	Deploy   string // the deploy/ folder (haproxy.cfg, nginx.conf)
	Proxy    Proxy
	// Relays puts a [Relay] in front of each replica (the checkpoint
	// fault); the proxy then connects to the relays.
	Relays bool
	// StoreLinks connects each replica to Redis through a [Relay] of its
	// own (Replica.StoreLink), which a partition cuts ([Cluster.Cut]);
	// plain Redis, so neither with Sentinel nor FileStore ([Setup.Validate]).
	StoreLinks bool
	// Down lists replicas (0..2) not started with the cluster: scaled out
	// later with [Cluster.Start].
	Down []int
	// Sentinel: Redis is a primary, a replica and three sentinels, and
	// the replicas find the primary through the sentinels, each write
	// acknowledged once the replica has it too (wait_replicas=1), unless
	// NoWait.
	Sentinel bool
	NoWait   bool
	// FileStore: the replicas keep sessions in the embedded store
	// (--state-store file:PATH), one file for the cluster, as one
	// machine's deployment does; the scenario starts one replica (Down
	// the others: the file is locked by its process; [Setup.Validate]
	// refuses a setup that does not). Redis runs unused.
	FileStore bool
}

// Validate refuses a setup naming two stores for the replicas:
// startProcess would run it on one of them (a StoreLink's Redis, else the
// sentinels, else the file), not on the one the scenario meant to fault.
// StoreLinks relay to plain Redis, past any sentinel. With FileStore, it
// refuses a setup that starts more or fewer than one replica.
func (s Setup) Validate() error {
	var stores []string
	if s.StoreLinks {
		stores = append(stores, "StoreLinks (Redis through relays)")
	}
	if s.Sentinel {
		stores = append(stores, "Sentinel")
	}
	if s.FileStore {
		stores = append(stores, "FileStore")
	}
	if len(stores) > 1 {
		return fmt.Errorf("the replicas' store is one of %s, not %d", strings.Join(stores, ", "), len(stores))
	}
	if s.FileStore {
		// The store's file is locked by the process that opened it: one
		// replica runs at a time (TestSetupFileStoreStartsOneReplica).
		up := 3
		for r := range 3 {
			if slices.Contains(s.Down, r) {
				up--
			}
		}
		if up != 1 {
			return fmt.Errorf("FileStore runs one replica on its file, but Down %v starts %d with the cluster", s.Down, up)
		}
	}
	return nil
}

// Cluster is three replicas, Redis and a proxy, started by [NewCluster]
// and stopped when the test ends. Its methods are for the test's
// goroutine (the scenario), and log each fault they inject on the
// cluster's timeline.
type Cluster struct {
	t     testing.TB
	setup Setup
	begin time.Time

	Redis     string // Redis's address (with Setup.Sentinel, the primary's)
	file      string // the embedded store's file (Setup.FileStore)
	redis     *proxytest.Process
	sent      *sentinels // with Setup.Sentinel
	Replicas  [3]*Replica
	ProxyAddr string // where clients connect
	ha        *proxytest.HAProxy
	nginx     *proxytest.Process // nginx's master
	proxyEnv  map[string]string  // the config's addresses, for ProxyStart
	proxyLogs strings.Builder    // output of its earlier processes

	mu       sync.Mutex
	timeline []string
}

// Replica is one `wasmtools serve --replica NAME` of a [Cluster].
type Replica struct {
	Name   string
	Listen string // its --http address
	Addr   string // the proxy's view of it: Listen, or its relay's address
	Relay  *Relay // nil without Setup.Relays
	// StoreLink is its way to Redis (nil without Setup.StoreLinks: it
	// connects to Redis itself).
	StoreLink *Relay
	proc      *proxytest.Process
	logs      strings.Builder // output of its earlier processes
}

// Running says whether the replica's current process is alive.
func (r *Replica) Running() bool { return r.proc != nil && !r.proc.Exited() }

// Output is everything the replica's processes wrote.
func (r *Replica) Output() string {
	out := r.logs.String()
	if r.proc != nil {
		out += r.proc.Output()
	}
	return out
}

// NewCluster starts Redis, the replicas (all but setup.Down) and the
// proxy, and returns once the proxy routes to every replica started.
func NewCluster(t testing.TB, setup Setup) *Cluster {
	t.Helper()
	if err := setup.Validate(); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, setup: setup, begin: time.Now()}
	c.Logf("starting")
	if setup.Sentinel {
		c.startSentinels()
	} else {
		c.Redis = proxytest.FreeAddr(t)
		c.redis = proxytest.StartRedisAt(t, c.Redis)
	}
	if setup.FileStore {
		c.file = filepath.Join(t.TempDir(), "sessions.db")
	}
	env := map[string]string{}
	for i := range c.Replicas {
		r := &Replica{Name: fmt.Sprintf("s%d", i+1), Listen: proxytest.FreeAddr(t)}
		r.Addr = r.Listen
		if setup.Relays {
			rl, err := NewHTTPRelay(proxytest.FreeAddr(t), r.Listen)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rl.Close)
			r.Relay, r.Addr = rl, rl.Addr
		}
		if setup.StoreLinks {
			rl, err := NewRelay(proxytest.FreeAddr(t), c.Redis)
			if err != nil {
				t.Fatal(err)
			}
			// Healed first, so that nothing waits on a cut at the end.
			t.Cleanup(func() { rl.Heal(); rl.Close() })
			r.StoreLink = rl
		}
		c.Replicas[i] = r
		env[fmt.Sprintf("S%d_ADDR", i+1)] = r.Addr
	}
	// One replica first: it compiles the plugins into the shared cache,
	// which the others then read. (Start fails the test: on this
	// goroutine only.)
	for i := range c.Replicas {
		if contains(setup.Down, i) {
			if r := c.Replicas[i]; r.Relay != nil {
				r.Relay.Close()
			}
			continue
		}
		c.startProcess(i, StateKey, true)
	}
	switch setup.Proxy {
	case HAProxy, Nginx:
		c.ProxyAddr, c.proxyEnv = proxytest.FreeAddr(t), env
		c.startProxy()
	case Direct:
		c.ProxyAddr = c.Replicas[0].Addr
	default:
		t.Fatalf("no proxy %q", setup.Proxy)
	}
	for i := range c.Replicas {
		if !contains(setup.Down, i) {
			c.WaitRouted(i)
		}
	}
	c.Logf("cluster up (%s)", setup.Proxy)
	t.Cleanup(func() {
		if dir := os.Getenv("FAULTS_LOGDIR"); dir != "" {
			// Every replica's whole log, for a timeline the tails above
			// cut short.
			base := filepath.Join(dir, strings.NewReplacer("/", "-").Replace(t.Name()))
			for _, r := range c.Replicas {
				if err := os.WriteFile(base+"."+r.Name+".log", []byte(r.Output()), 0o644); err != nil {
					t.Log(err)
				}
			}
		}
		if t.Failed() && os.Getenv("FAULTS_LOGS") != "" {
			for _, r := range c.Replicas {
				t.Logf("replica %s:\n%s", r.Name, tail(r.Output(), 80))
			}
			if c.ha != nil {
				t.Logf("haproxy:\n%s", tail(c.proxyLogs.String()+c.ha.Output(), 40))
			}
			if c.sent != nil {
				t.Logf("%s", c.sent.logs(40))
			}
		}
	})
	return c
}

func contains(s []int, i int) bool {
	for _, v := range s {
		if v == i {
			return true
		}
	}
	return false
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Logf adds an event to the cluster's timeline, at its time since the
// cluster started.
func (c *Cluster) Logf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := fmt.Sprintf("%7.2fs %s", time.Since(c.begin).Seconds(), fmt.Sprintf(format, args...))
	c.timeline = append(c.timeline, e)
	if os.Getenv("FAULTS_VERBOSE") != "" {
		fmt.Fprintln(os.Stderr, e)
	}
}

// Timeline returns the events logged so far.
func (c *Cluster) Timeline() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.timeline...)
}

// Since is t's time on the cluster's timeline.
func (c *Cluster) Since(t time.Time) time.Duration { return t.Sub(c.begin) }

// startProcess starts replica i's process with state key key; ready says
// whether to wait for its /readyz (else for its /healthz only).
func (c *Cluster) startProcess(i int, key string, ready bool) {
	r := c.Replicas[i]
	if r.proc != nil {
		r.logs.WriteString(r.proc.Output())
	}
	store := "redis://" + c.Redis + "/0"
	switch {
	case r.StoreLink != nil:
		store = "redis://" + r.StoreLink.Addr + "/0"
	case c.sent != nil:
		store = c.sent.storeURL()
	case c.file != "":
		store = "file:" + c.file
	}
	cmd := exec.Command(c.setup.Binary, "serve", "--cache-dir", c.setup.CacheDir, "--no-watch",
		"--http", r.Listen, "--replica", r.Name, "--state-store", store, c.setup.Plugins)
	cmd.Env = append(os.Environ(), "WASMTOOLS_STATE_KEY="+key, "WASMTOOLS_AUTH_TOKEN="+Token)
	path := "/readyz"
	if !ready {
		path = "/healthz"
	}
	r.proc = proxytest.StartWithin(c.t, cmd, ReadyTimeout, func() error { return get("http://" + r.Listen + path) })
	if r.Relay != nil {
		r.Relay.Open()
	}
}

func get(url string) error {
	res, err := http.Get(url)
	if err != nil {
		return err
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, res.Status)
	}
	return nil
}

// Start starts replica i again (or for the first time) and waits until
// the proxy routes its sessions to it.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	c.startProcess(i, StateKey, true)
	c.WaitRouted(i)
	c.Logf("%s started and routed", c.Replicas[i].Name)
}

// StartWithKey starts replica i with state key key, waiting only until it
// is alive (its /healthz): a replica with another key than the store's
// must not become ready.
func (c *Cluster) StartWithKey(i int, key string) {
	c.t.Helper()
	c.startProcess(i, key, false)
	c.Logf("%s started with another state key", c.Replicas[i].Name)
}

// Readyz returns replica i's /readyz status and body (0 if it does not
// answer).
func (c *Cluster) Readyz(i int) (int, string) {
	res, err := http.Get("http://" + c.Replicas[i].Listen + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	return res.StatusCode, string(b)
}

// WaitRouted waits until the proxy sends replica i's sessions to it:
// HAProxy reports it UP and a request for one of its sessions reaches it;
// nginx (no health checks: it tries a session's replica first on every
// request) once the replica is ready.
func (c *Cluster) WaitRouted(i int) {
	c.t.Helper()
	r := c.Replicas[i]
	probe := func() error {
		req, _ := http.NewRequest(http.MethodGet, "http://"+c.ProxyAddr+"/readyz", nil)
		req.Header.Set("Mcp-Session-Id", r.Name+".probe")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz for a session of %s: %s", r.Name, res.Status)
		}
		return nil
	}
	if c.ha != nil {
		c.ha.WaitRouted("sessions/"+r.Name, probe)
		return
	}
	if c.setup.Proxy == Direct {
		return // started ready
	}
	if err := probe(); err != nil {
		c.t.Fatalf("nginx: %s ready but not routed: %v", r.Name, err)
	}
}

// WaitDown waits, with HAProxy, until it reports replica i DOWN; with
// nginx it returns at once.
func (c *Cluster) WaitDown(i int) {
	c.t.Helper()
	if c.ha != nil {
		c.ha.WaitDown("sessions/" + c.Replicas[i].Name)
	}
}

// Kill ends replica i with SIGKILL (its relay stops listening first, as
// the replica's port would close) and waits for it to exit.
func (c *Cluster) Kill(i int) {
	c.t.Helper()
	r := c.Replicas[i]
	if r.Relay != nil {
		r.Relay.Close()
	}
	r.proc.Signal(syscall.SIGKILL)
	c.waitExit(i)
	c.Logf("%s killed (-9)", r.Name)
}

// Term sends replica i SIGTERM and waits until it has drained and
// exited.
func (c *Cluster) Term(i int) {
	c.t.Helper()
	r := c.Replicas[i]
	c.Logf("%s SIGTERM", r.Name)
	r.proc.Signal(syscall.SIGTERM)
	c.waitExit(i)
	if r.Relay != nil {
		r.Relay.Close()
	}
	c.Logf("%s exited", r.Name)
}

// TermNoWait sends replica i SIGTERM and returns: its drain under way.
func (c *Cluster) TermNoWait(i int) {
	c.Logf("%s SIGTERM (not waiting for its exit)", c.Replicas[i].Name)
	c.Replicas[i].proc.Signal(syscall.SIGTERM)
}

// KillIfRunning is [Cluster.Kill] for a replica that may have exited
// already (a drain that finished first); it says which.
func (c *Cluster) KillIfRunning(i int) bool {
	c.t.Helper()
	r := c.Replicas[i]
	if !r.Running() {
		c.Logf("%s had exited already", r.Name)
		if r.Relay != nil {
			r.Relay.Close()
		}
		return false
	}
	c.Kill(i)
	return true
}

// WaitExit waits until replica i has exited (after [Cluster.TermNoWait]).
func (c *Cluster) WaitExit(i int) {
	c.t.Helper()
	c.waitExit(i)
	if r := c.Replicas[i]; r.Relay != nil {
		r.Relay.Close()
	}
	c.Logf("%s exited", c.Replicas[i].Name)
}

func (c *Cluster) waitExit(i int) {
	c.t.Helper()
	select {
	case <-c.Replicas[i].proc.Done():
	case <-time.After(2 * time.Minute):
		c.t.Fatalf("replica %s did not exit:\n%s", c.Replicas[i].Name, tail(c.Replicas[i].Output(), 40))
	}
}

// Freeze sends replica i SIGSTOP; Thaw sends SIGCONT.
func (c *Cluster) Freeze(i int) {
	c.Replicas[i].proc.Signal(syscall.SIGSTOP)
	c.Logf("%s SIGSTOP", c.Replicas[i].Name)
}

func (c *Cluster) Thaw(i int) {
	c.Replicas[i].proc.Signal(syscall.SIGCONT)
	c.Logf("%s SIGCONT", c.Replicas[i].Name)
}

// Cut partitions replica i from Redis: its store link blackholes
// everything both ways ([Relay.Cut]), while the proxy, the other replicas
// and Redis reach one another as before. Heal ends the partition, and
// what was held on the link arrives late.
func (c *Cluster) Cut(i int) {
	c.Replicas[i].StoreLink.Cut()
	c.Logf("%s cut off from redis (blackholed)", c.Replicas[i].Name)
}

func (c *Cluster) Heal(i int) {
	sends, bytes := c.Replicas[i].StoreLink.Heal()
	c.Logf("%s reaches redis again (what the cut held delivered late: %d sends, %d bytes of them in the relay)", c.Replicas[i].Name, sends, bytes)
}

// SlowStore makes replica i's link to Redis slow (d: see [Relay.Slow]);
// 0 makes it fast again.
func (c *Cluster) SlowStore(i int, d time.Duration) {
	c.Replicas[i].StoreLink.Slow(d)
	if d > 0 {
		c.Logf("%s's link to redis slow: %v to %v a send each way", c.Replicas[i].Name, d/2, d)
	} else {
		c.Logf("%s's link to redis fast again", c.Replicas[i].Name)
	}
}

// Unroute makes replica i's port refuse the proxy's connections (its
// relay stops listening and ends its connections), as a host whose
// firewall rejects them: the proxy fails its sessions over, though the
// replica runs on. Reroute listens again and waits until the proxy routes
// its sessions to it.
func (c *Cluster) Unroute(i int) {
	c.Replicas[i].Relay.Close()
	c.Logf("%s refuses the proxy", c.Replicas[i].Name)
}

func (c *Cluster) Reroute(i int) {
	c.t.Helper()
	if err := c.Replicas[i].Relay.Open(); err != nil {
		c.t.Fatalf("relay of %s: %v", c.Replicas[i].Name, err)
	}
	c.WaitRouted(i)
	c.Logf("%s routed again", c.Replicas[i].Name)
}

// RedisKill kills Redis (-9): without persistence, it comes back empty.
func (c *Cluster) RedisKill() {
	c.redis.Signal(syscall.SIGKILL)
	<-c.redis.Done()
	c.Logf("redis killed")
}

// RedisStart starts an empty Redis at the same address.
func (c *Cluster) RedisStart() {
	c.t.Helper()
	c.redis = proxytest.StartRedisAt(c.t, c.Redis)
	c.Logf("redis started (empty)")
}

// RedisEvictValues deletes every session's values kept out of line
// (internal/statestore's Redis keeps a value of 16 KiB or more under a key
// of its own), as Redis evicting them apart from their records would under
// a maxmemory policy other than noeviction. It returns how many it
// deleted.
func (c *Cluster) RedisEvictValues() int {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc := redis.NewClient(&redis.Options{Addr: c.Redis})
	defer rc.Close()
	keys, err := rc.Keys(ctx, "wt:{*}:v:*").Result()
	if err == nil && len(keys) > 0 {
		err = rc.Del(ctx, keys...).Err()
	}
	if err != nil {
		c.t.Fatalf("redis: evicting values: %v", err)
	}
	c.Logf("redis: %d values evicted", len(keys))
	return len(keys)
}

// RedisFreeze sends Redis SIGSTOP; RedisThaw sends SIGCONT.
func (c *Cluster) RedisFreeze() {
	c.redis.Signal(syscall.SIGSTOP)
	c.Logf("redis SIGSTOP")
}

func (c *Cluster) RedisThaw() {
	c.redis.Signal(syscall.SIGCONT)
	c.Logf("redis SIGCONT")
}

// startProxy starts the proxy at ProxyAddr with its config of deploy/.
func (c *Cluster) startProxy() {
	c.t.Helper()
	if c.setup.Proxy == HAProxy {
		c.ha = proxytest.StartHAProxyAt(c.t, filepath.Join(c.setup.Deploy, "haproxy.cfg"), c.ProxyAddr, c.proxyEnv)
		return
	}
	c.nginx = proxytest.StartNginxAt(c.t, filepath.Join(c.setup.Deploy, "nginx.conf"), c.ProxyAddr, c.proxyEnv)
}

// ProxyKill kills the proxy (-9; nginx's master and workers), as a
// proxy's pod or host lost: every request and stream through it is cut,
// mid-call too, and new connections are refused until
// [Cluster.ProxyStart].
func (c *Cluster) ProxyKill() {
	p := c.nginx
	if c.ha != nil {
		p = c.ha.Process
	}
	syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	<-p.Done()
	c.proxyLogs.WriteString(p.Output())
	c.Logf("%s killed", c.setup.Proxy)
}

// ProxyStart starts the proxy again at its address, with its config, and
// waits until it routes to every running replica.
func (c *Cluster) ProxyStart() {
	c.t.Helper()
	c.startProxy()
	for i, r := range c.Replicas {
		if r.Running() {
			c.WaitRouted(i)
		}
	}
	c.Logf("%s started again", c.setup.Proxy)
}
