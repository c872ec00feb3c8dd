package faults

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// MasterName is the name the sentinels of a [Setup.Sentinel] cluster
// monitor the Redis primary under.
const MasterName = "wasmtools"

// The sentinels' timings. Down-after is short, so that a failover is over
// in a few seconds. The failover timeout is also how long a sentinel lets
// a replica replicate from another address than the primary's before it
// points it back ("+fix-slave-config"): longer than a replication link
// sent through a relay is silent ([Cluster.SilenceReplication]), which
// must not be mended behind the fault's back; and twice it, the wait
// before a new election when one failed to choose a leader, is still
// short.
const (
	SentinelDownAfter       = 1 * time.Second
	SentinelFailoverTimeout = 10 * time.Second
)

// FailoverTimeout bounds the wait for the sentinels to agree on a new
// primary, and for a Redis to sync with its primary: past an election
// that chose no leader (2 × SentinelFailoverTimeout) on a loaded machine.
const FailoverTimeout = 90 * time.Second

// redisNode is one redis-server of a Sentinel cluster: a primary or its
// replica.
type redisNode struct {
	addr string
	proc *proxytest.Process
	logs strings.Builder // output of its earlier processes
}

func (n *redisNode) output() string {
	out := n.logs.String()
	if n.proc != nil {
		out += n.proc.Output()
	}
	return out
}

// sentinels is the Redis of a [Setup.Sentinel] cluster: a primary, its
// replica, and three sentinels that monitor them.
type sentinels struct {
	nodes     [2]*redisNode
	primary   int // index in nodes
	addrs     []string
	procs     []*proxytest.Process
	link      *proxytest.Relay // the replica's relay to the primary, SilenceReplication's
	switches  int              // failovers seen by every sentinel so far
	waitRepls int              // the replicas' wait_replicas
}

// startSentinels starts a primary, a replica of it and three sentinels,
// on free loopback ports, and returns once every sentinel knows the
// replica and the two other sentinels (so that a failover needs no
// discovery).
func (c *Cluster) startSentinels() {
	t := c.t
	t.Helper()
	s := &sentinels{waitRepls: 1}
	if c.setup.NoWait {
		s.waitRepls = 0
	}
	c.sent = s
	for i := range s.nodes {
		s.nodes[i] = &redisNode{addr: proxytest.FreeAddr(t)}
	}
	s.nodes[0].proc = startRedisNode(t, s.nodes[0].addr, "")
	c.Redis, c.redis = s.nodes[0].addr, s.nodes[0].proc
	c.startReplicaOf(1, 0)
	for range 3 {
		addr := proxytest.FreeAddr(t)
		path := proxytest.SentinelConf(t, addr, MasterName, s.nodes[0].addr, 2, SentinelDownAfter, SentinelFailoverTimeout)
		p := proxytest.StartRedisWith(t, func() (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) }, path, "--sentinel")
		s.addrs = append(s.addrs, addr)
		s.procs = append(s.procs, p)
	}
	replica := "+slave slave " + s.nodes[1].addr
	for i, p := range s.procs {
		if !p.WaitOutput(FailoverTimeout, func(out string) bool {
			return strings.Contains(out, replica) && strings.Count(out, "+sentinel sentinel ") >= 2
		}) {
			t.Fatalf("sentinel %d does not know the replica %s and the other sentinels:\n%s", i+1, s.nodes[1].addr, p.Output())
		}
	}
	c.Logf("redis primary %s, replica %s, sentinels %s (wait_replicas=%d)", s.nodes[0].addr, s.nodes[1].addr, strings.Join(s.addrs, " "), s.waitRepls)
}

// startRedisNode starts a redis-server at addr, a replica of primary
// unless it is "".
func startRedisNode(t testing.TB, addr, primary string) *proxytest.Process {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	// No delay before a full sync (5 s by default, for more replicas to
	// share it): a rejoining replica is synced at once.
	args := []string{"--port", port, "--bind", "127.0.0.1", "--repl-diskless-sync-delay", "0"}
	if primary != "" {
		host, pport, _ := net.SplitHostPort(primary)
		args = append(args, "--replicaof", host, pport)
	}
	return proxytest.StartRedisWith(t, func() (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) }, args...)
}

// startReplicaOf starts node i (again: a new process, empty) as a replica
// of node p, and waits until p counts it ([Cluster.waitReplicated]).
func (c *Cluster) startReplicaOf(i, p int) {
	c.t.Helper()
	n := c.sent.nodes[i]
	if n.proc != nil {
		n.logs.WriteString(n.proc.Output())
	}
	n.proc = startRedisNode(c.t, n.addr, c.sent.nodes[p].addr)
	c.waitReplicated(p)
}

// waitReplicated waits until node p, a primary, has a replica that holds
// everything p had and is streamed to ([proxytest.WaitReplica]).
func (c *Cluster) waitReplicated(p int) {
	c.t.Helper()
	addr := c.sent.nodes[p].addr
	if err := proxytest.WaitReplica(addr, FailoverTimeout); err != nil {
		c.t.Fatalf("redis %s has no replica in sync: %v\n%s", addr, err, c.sent.logs(40))
	}
}

// storeURL is the --state-store of the cluster's replicas: go-redis's
// failover URL, the first sentinel as its host and the others as addr
// parameters, with wait_replicas.
func (s *sentinels) storeURL() string {
	q := url.Values{"master_name": {MasterName}, "addr": s.addrs[1:]}
	if s.waitRepls > 0 {
		q.Set("wait_replicas", fmt.Sprint(s.waitRepls))
	}
	return "redis://" + s.addrs[0] + "/0?" + q.Encode()
}

// PrimaryKill kills the Redis primary (-9): its data is gone with it, but
// for what its replica holds.
func (c *Cluster) PrimaryKill() {
	c.t.Helper()
	s := c.sent
	n := s.nodes[s.primary]
	n.proc.Signal(syscall.SIGKILL)
	<-n.proc.Done()
	c.Logf("redis primary %s killed (-9)", n.addr)
}

// WaitFailover waits until every sentinel has switched to the replica as
// the new primary ("+switch-master"), which has then answered as one: the
// cluster's replicas, asking any sentinel, are sent to it.
func (c *Cluster) WaitFailover() {
	c.t.Helper()
	s := c.sent
	old, next := s.nodes[s.primary], s.nodes[1-s.primary]
	want := fmt.Sprintf("+switch-master %s %s %s",
		MasterName, strings.Replace(old.addr, ":", " ", 1), strings.Replace(next.addr, ":", " ", 1))
	for i, p := range s.procs {
		if !p.WaitOutput(FailoverTimeout, func(out string) bool { return strings.Count(out, want) > s.switches }) {
			c.t.Fatalf("sentinel %d did not switch to %s within %v:\n%s", i+1, next.addr, FailoverTimeout, p.Output())
		}
	}
	s.switches++
	s.primary = 1 - s.primary
	c.Redis = next.addr
	c.Logf("sentinels switched to %s (+switch-master)", next.addr)
}

// RejoinOldPrimary starts the old primary again, empty, as a replica of
// the new one, and waits until it has synced: it must not start as a
// primary, whose empty data its replica would copy had the sentinels not
// switched yet.
func (c *Cluster) RejoinOldPrimary() {
	c.t.Helper()
	s := c.sent
	c.startReplicaOf(1-s.primary, s.primary)
	c.redis = s.nodes[s.primary].proc
	c.Logf("redis %s started again, empty, as a replica of %s, and synced", s.nodes[1-s.primary].addr, s.nodes[s.primary].addr)
}

// SilenceReplication points the replica at the primary through a relay
// (REPLICAOF the relay: a partial resync) and, once the replica has
// synced through it, makes the relay swallow everything both ways: the
// primary's writes no longer reach the replica, nor the replica's
// acknowledgements the primary, while both connections stay open. The
// sentinels still reach the replica directly, and see it fit to be
// promoted (its link is up, for SentinelFailoverTimeout at least).
func (c *Cluster) SilenceReplication() {
	c.t.Helper()
	s := c.sent
	primary, replica := s.nodes[s.primary], s.nodes[1-s.primary]
	s.link = proxytest.StartRelay(c.t, primary.addr)
	const accepted = "MASTER <-> REPLICA sync: Master accepted a Partial Resynchronization"
	before := strings.Count(replica.proc.Output(), accepted)
	host, port, _ := net.SplitHostPort(s.link.Addr())
	c.redisDo(replica.addr, "REPLICAOF", host, port)
	if !replica.proc.WaitOutput(FailoverTimeout, func(out string) bool { return strings.Count(out, accepted) > before }) {
		c.t.Fatalf("redis %s did not resync through the relay %s:\n%s", replica.addr, s.link.Addr(), replica.proc.Output())
	}
	c.waitReplicated(s.primary)
	s.link.SetMode(proxytest.RelaySilent)
	c.Logf("replication %s -> %s through a relay, silent from now on", primary.addr, replica.addr)
}

// redisDo sends one command to the Redis at addr, failing the test if it
// fails.
func (c *Cluster) redisDo(addr string, args ...any) any {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	v, err := rc.Do(ctx, args...).Result()
	if err != nil {
		c.t.Fatalf("redis %s: %v: %v", addr, args, err)
	}
	return v
}

// sentinelLogs is the sentinels' and Redis nodes' output, for a failed
// scenario's report.
func (s *sentinels) logs(n int) string {
	var b strings.Builder
	for i, nd := range s.nodes {
		fmt.Fprintf(&b, "redis %d (%s):\n%s\n", i+1, nd.addr, tail(nd.output(), n))
	}
	for i, p := range s.procs {
		fmt.Fprintf(&b, "sentinel %d (%s):\n%s\n", i+1, s.addrs[i], tail(p.Output(), n))
	}
	return b.String()
}
