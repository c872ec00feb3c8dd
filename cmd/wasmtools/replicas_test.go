package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// The replica set of the end-to-end test: three `wasmtools serve --http`
// processes sharing a redis-server, behind HAProxy with
// deploy/haproxy.cfg unchanged, all real processes on 127.0.0.1.
type replicaSet struct {
	t      *testing.T
	dir    string
	redis  string
	names  [3]string
	addrs  [3]string
	procs  [3]*proxytest.Process
	logs   [3]string // the output of earlier processes of each replica
	proxy  string
	ha     *proxytest.HAProxy
	client *http.Client
}

const replicaStateKey = "the state key every replica of the test shares"

func newReplicaSet(t *testing.T) *replicaSet {
	t.Helper()
	rs := &replicaSet{t: t, names: [3]string{"s1", "s2", "s3"}}
	rs.dir = testplugins.Folder(t, map[string]string{
		"notes.wasm":      testplugins.Example(t, "notes"),
		"nosnapshot.wasm": testplugins.Test(t, "nosnapshot"),
	})
	rs.redis = proxytest.StartRedis(t)
	env := map[string]string{}
	for i := range rs.names {
		rs.addrs[i] = proxytest.FreeAddr(t)
		rs.start(i)
		env[fmt.Sprintf("S%d_ADDR", i+1)] = rs.addrs[i]
	}
	cfg, err := filepath.Abs("../../deploy/haproxy.cfg")
	if err != nil {
		t.Fatal(err)
	}
	rs.ha = proxytest.StartHAProxy(t, cfg, env)
	rs.proxy = "http://" + rs.ha.Addr + "/mcp"
	rs.client = &http.Client{}
	for _, name := range rs.names {
		rs.waitUp(name)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i := range rs.names {
				out := rs.logs[i]
				if rs.procs[i] != nil {
					out += rs.procs[i].Output()
				}
				t.Logf("replica %s:\n%s", rs.names[i], tail(out, 60))
			}
			t.Logf("haproxy:\n%s", tail(rs.ha.Output(), 30))
		}
	})
	return rs
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitUp waits until the proxy routes replica name's sessions to it:
// HAProxy reports sessions/NAME UP, and name's /readyz, asked through the
// proxy for a session of name, says so (asked again only on HAProxy's
// next report on it).
func (rs *replicaSet) waitUp(name string) {
	rs.t.Helper()
	url := "http://" + rs.ha.Addr + "/readyz"
	rs.ha.WaitRouted("sessions/"+name, func() error {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Mcp-Session-Id", name+".probe")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != "ready "+name+"\n" {
			return fmt.Errorf("/readyz for a session of %s: %s %q", name, res.Status, b)
		}
		return nil
	})
}

// waitDown waits until HAProxy reports replica name DOWN (stopped or
// draining), so that a later waitUp waits for its next UP.
func (rs *replicaSet) waitDown(name string) {
	rs.t.Helper()
	rs.ha.WaitDown("sessions/" + name)
}

// start starts replica i, and waits until it is ready (/readyz: its
// plugins loaded).
func (rs *replicaSet) start(i int) {
	rs.t.Helper()
	if p := rs.procs[i]; p != nil {
		rs.logs[i] += p.Output()
	}
	cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--no-watch",
		"--http", rs.addrs[i], "--replica", rs.names[i], "--state-store", "redis://"+rs.redis+"/0", "--derive-session-header",
		"--shutdown-grace", "30s", rs.dir)
	cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1", "WASMTOOLS_STATE_KEY="+replicaStateKey)
	// startupTimeout, not proxytest's 20 s: a replica loads a Go plugin
	// (notes), which under -race on a loaded machine took longer.
	rs.procs[i] = proxytest.StartWithin(rs.t, cmd, startupTimeout, readyAt(rs.addrs[i]))
}

// readyAt is the readiness of `wasmtools serve --http addr`: its /readyz
// answers 200 (its plugins loaded).
func readyAt(addr string) func() error {
	return func() error {
		res, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", res.Status)
		}
		return nil
	}
}

// kill ends replica i with SIGKILL: nothing is drained.
func (rs *replicaSet) kill(i int) {
	p := rs.procs[i]
	syscall.Kill(p.Cmd.Process.Pid, syscall.SIGKILL)
	rs.waitExit(i)
}

// term sends replica i SIGTERM and waits until it has drained and exited.
func (rs *replicaSet) term(i int) {
	p := rs.procs[i]
	syscall.Kill(p.Cmd.Process.Pid, syscall.SIGTERM)
	rs.waitExit(i)
	if !strings.Contains(p.Output(), "drained") {
		rs.t.Errorf("replica %s exited without draining:\n%s", rs.names[i], tail(p.Output(), 30))
	}
}

func (rs *replicaSet) waitExit(i int) {
	rs.t.Helper()
	select {
	case <-rs.procs[i].Done():
	case <-time.After(time.Minute):
		rs.t.Fatalf("replica %s did not exit", rs.names[i])
	}
}

// mcpClient is one client of the test: a stateful session (2025-11-25)
// or a 2026-07-28 client with a session handle.
type mcpClient struct {
	n      int
	modern bool
	cs     *mcp.ClientSession
	handle string
	notes  []string // every note a call said it saved
	counts int      // calls of count since its state started
}

// replica is the name of the replica that began the client's session.
func (c *mcpClient) replica() string {
	id := c.cs.ID()
	if c.modern {
		id = c.handle
	}
	name, _, _ := strings.Cut(id, ".")
	return name
}

func (c *mcpClient) args(m map[string]any) map[string]any {
	if m == nil {
		m = map[string]any{}
	}
	if c.handle != "" {
		m["wasmtools_session"] = c.handle
	}
	return m
}

// call calls tool; any error, error result or unexpected reset is
// returned as an error.
func (c *mcpClient) call(ctx context.Context, tool string, args map[string]any) (*mcp.CallToolResult, error) {
	res, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: c.args(args)})
	if err != nil {
		return nil, fmt.Errorf("client %d (%s): %s: %w", c.n, c.replica(), tool, err)
	}
	if res.IsError {
		return nil, fmt.Errorf("client %d (%s): %s: error result: %s", c.n, c.replica(), tool, resultText(res))
	}
	if h, _ := res.Meta["dev.wasmtools/session"].(string); c.modern && c.handle == "" {
		c.handle = h
	}
	return res, nil
}

func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, b := range res.Content {
		if tc, ok := b.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func (c *mcpClient) addNote(ctx context.Context) error {
	text := fmt.Sprintf("client %d note %d", c.n, len(c.notes)+1)
	res, err := c.call(ctx, "note_add", map[string]any{"text": text})
	if err != nil {
		return err
	}
	if reset := res.Meta["dev.wasmtools/stateReset"]; reset != nil {
		return fmt.Errorf("client %d (%s): note_add: state reset %v", c.n, c.replica(), reset)
	}
	if want := fmt.Sprintf("note %d saved", len(c.notes)+1); !strings.Contains(resultText(res), want) {
		return fmt.Errorf("client %d (%s): note_add said %q, want %q", c.n, c.replica(), resultText(res), want)
	}
	c.notes = append(c.notes, text)
	return nil
}

// checkNotes checks that note_list has every note the client saved.
func (c *mcpClient) checkNotes(ctx context.Context) error {
	res, err := c.call(ctx, "note_list", nil)
	if err != nil {
		return err
	}
	if reset := res.Meta["dev.wasmtools/stateReset"]; reset != nil {
		return fmt.Errorf("client %d (%s): note_list: state reset %v", c.n, c.replica(), reset)
	}
	var want strings.Builder
	for i, n := range c.notes {
		fmt.Fprintf(&want, "%d. %s\n", i+1, n)
	}
	if got := resultText(res); got != want.String() {
		return fmt.Errorf("client %d (%s): note_list =\n%s\nwant\n%s", c.n, c.replica(), got, want.String())
	}
	return nil
}

// connect opens n clients of each era through the proxy.
func (rs *replicaSet) connect(ctx context.Context, n int) []*mcpClient {
	rs.t.Helper()
	var clients []*mcpClient
	for i := range 2 * n {
		c := &mcpClient{n: i, modern: i%2 == 1}
		protocol := "2025-11-25"
		if c.modern {
			protocol = "" // the go-sdk client's default: 2026-07-28
		}
		tr := &mcp.StreamableClientTransport{Endpoint: rs.proxy, HTTPClient: rs.client}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
		if err != nil {
			rs.t.Fatalf("client %d: connect: %v", i, err)
		}
		rs.t.Cleanup(func() { cs.Close() })
		if c.modern {
			// The client learns the session argument's header.
			if _, err := cs.ListTools(ctx, nil); err != nil {
				rs.t.Fatal(err)
			}
		}
		c.cs = cs
		clients = append(clients, c)
	}
	return clients
}

// each runs f for every client, 8 at a time, and returns the errors.
func each(clients []*mcpClient, f func(c *mcpClient) error) []error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, 8)
	for _, c := range clients {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := f(c); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errs
}

func failOn(t *testing.T, what string, errs []error) {
	t.Helper()
	if len(errs) == 0 {
		return
	}
	for i, err := range errs {
		if i == 10 {
			t.Errorf("%s: %d more", what, len(errs)-10)
			break
		}
		t.Errorf("%s: %v", what, err)
	}
	t.FailNow()
}

// TestReplicasBehindHAProxy is the replicas issue's acceptance test: 50
// clients of each era keep every note across a replica killed (-9) and
// another drained (SIGTERM), the clients of a plugin that cannot be
// snapshotted are told their state was lost, and a rolling restart of all
// three replicas under steady load fails no call and loses no note.
func TestReplicasBehindHAProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, HAProxy and three replicas")
	}
	rs := newReplicaSet(t)
	ctx := context.Background()
	clients := rs.connect(ctx, 50)
	failOn(t, "before", each(clients, func(c *mcpClient) error {
		for range 3 {
			if err := c.addNote(ctx); err != nil {
				return err
			}
		}
		for range 2 {
			if _, err := c.call(ctx, "count", nil); err != nil {
				return err
			}
			c.counts++
		}
		return nil
	}))
	on := map[string]int{}
	for _, c := range clients {
		on[c.replica()]++
	}
	t.Logf("sessions per replica: %v", on)
	if on["s1"] == 0 || on["s2"] == 0 || on["s3"] == 0 {
		t.Fatalf("the proxy did not spread the sessions: %v", on)
	}

	// s1 is killed, s2 drains; every client's next calls go on.
	var wg sync.WaitGroup
	wg.Go(func() { rs.kill(0) })
	wg.Go(func() { rs.term(1) })
	wg.Wait()
	var resets atomic.Int32
	failOn(t, "after s1 was killed and s2 drained", each(clients, func(c *mcpClient) error {
		if err := c.checkNotes(ctx); err != nil {
			return err
		}
		res, err := c.call(ctx, "count", nil)
		if err != nil {
			return err
		}
		reset, _ := res.Meta["dev.wasmtools/stateReset"].(map[string]any)
		lost := c.replica() == "s1" || c.replica() == "s2"
		switch {
		case lost && (reset["reason"] != "replica-lost" || resultText(res) != "1"):
			return fmt.Errorf("client %d (%s): count after its replica went: %s, %v; want 1 and a replica-lost reset", c.n, c.replica(), resultText(res), res.Meta)
		case !lost && (reset != nil || resultText(res) != fmt.Sprint(c.counts+1)):
			return fmt.Errorf("client %d (%s): count: %s, %v; want %d and no reset", c.n, c.replica(), resultText(res), res.Meta, c.counts+1)
		}
		if lost {
			resets.Add(1)
		}
		return nil
	}))
	t.Logf("%d clients told their count's state was lost", resets.Load())

	// Back to three replicas, then a rolling restart under steady load.
	rs.waitDown("s1")
	rs.waitDown("s2")
	rs.start(0)
	rs.start(1)
	rs.waitUp("s1")
	rs.waitUp("s2")
	// The load: rounds in which every client adds a note and checks them
	// all; each round's end is signalled on rounds.
	stop := make(chan struct{})
	rounds := make(chan int, 1)
	load := make(chan []error, 1)
	var calls atomic.Int64
	go func() {
		defer close(rounds)
		for n := 1; ; n++ {
			select {
			case <-stop:
				load <- nil
				return
			default:
			}
			errs := each(clients, func(c *mcpClient) error {
				if err := c.addNote(ctx); err != nil {
					return err
				}
				calls.Add(2)
				return c.checkNotes(ctx)
			})
			if len(errs) > 0 {
				load <- errs
				return
			}
			select {
			case rounds <- n:
			default:
			}
		}
	}()
	// waitRound waits for the end of a round that began after now.
	waitRound := func() {
		<-rounds // may have begun before
		if _, ok := <-rounds; !ok {
			failOn(t, "rolling restart", <-load)
		}
	}
	waitRound()
	for i := range rs.names {
		rs.term(i)
		rs.waitDown(rs.names[i])
		waitRound() // served by two replicas
		rs.start(i)
		rs.waitUp(rs.names[i])
		waitRound()
	}
	close(stop)
	for range rounds {
	}
	failOn(t, "rolling restart", <-load)
	for _, c := range clients {
		if err := c.checkNotes(ctx); err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d calls during the rolling restart, none failed; %d notes kept", calls.Load(), countNotes(clients))
}

func countNotes(clients []*mcpClient) int {
	n := 0
	for _, c := range clients {
		n += len(c.notes)
	}
	return n
}

// TestFileStoreKeepsSessionsAcrossRestart: one replica on one machine,
// with the embedded store (--state-store file:PATH) and no state key set:
// a restart keeps every session of both eras.
func TestFileStoreKeepsSessionsAcrossRestart(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	state := filepath.Join(t.TempDir(), "sessions.db")
	addr := proxytest.FreeAddr(t)
	start := func() *proxytest.Process {
		cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--no-watch",
			"--http", addr, "--state-store", "file:"+state, dir)
		cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1", "WASMTOOLS_OPERATOR_TOKEN="+testOperatorToken)
		return proxytest.StartWithin(t, cmd, startupTimeout, readyAt(addr))
	}
	p := start()
	rs := &replicaSet{t: t, proxy: "http://" + addr + "/mcp", client: &http.Client{}}
	ctx := context.Background()
	clients := rs.connect(ctx, 1)
	for _, c := range clients {
		for range 2 {
			if err := c.addNote(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// POST /drain stops it as SIGTERM does (the e2e test sends that).
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/drain", nil)
	req.Header.Set("Authorization", "Bearer "+testOperatorToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /drain: %s", res.Status)
	}
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		t.Fatal("serve did not exit after POST /drain")
	}
	if !strings.Contains(p.Output(), "drained") {
		t.Fatalf("serve exited without draining:\n%s", p.Output())
	}
	if _, err := os.Stat(state + ".key"); err != nil {
		t.Fatalf("no state key made beside the store: %v", err)
	}
	p = start()
	for _, c := range clients {
		if err := c.checkNotes(ctx); err != nil {
			t.Fatalf("%v\n%s", err, p.Output())
		}
		if err := c.addNote(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
