package faults

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"time"
)

// The timings of the faults. Past the claim timeouts: a replica's
// heartbeat lives 6 s (internal/durable), so a replica stopped 8 s has
// lost its claims to whoever takes its sessions over.
const (
	StopFor      = 8 * time.Second
	RedisDownFor = 10 * time.Second
	RedisFreeze  = 10 * time.Second
	// PartitionFor is how long a replica is cut off from Redis in
	// partition-store: past its 2 s of grace from memory, its 2.5 s lease,
	// the 5 s of a Redis read timeout and the 6 s of its heartbeat.
	// PartitionAlone is how long of it the proxy reaches the replica
	// before failing it over.
	PartitionFor   = 10 * time.Second
	PartitionAlone = 3 * time.Second
	// BadKeyWatch is how long a replica started with another state key
	// is watched (while the clients run) for becoming ready.
	BadKeyWatch = 10 * time.Second
	// ReplicationSilentFor is how long redis-failover-silent's
	// replication link swallows everything before the primary dies:
	// past the store's 1 s WAIT, several writes of every client.
	ReplicationSilentFor = 3 * time.Second
	// StopPastProxyFor is how long sigstop-past-proxy stops a replica:
	// past the proxies' own timeouts (HAProxy's timeout server and
	// nginx's proxy_read_timeout, 15 s), after which each sends a request
	// that got no answer on to the session's fallback (HAProxy's
	// retry-on response-timeout, nginx's 504 in $resend), besides the
	// lease, the grace, the heartbeat and HAProxy's health checks.
	// ProxyWaitAttempt is its clients' attempt timeout: longer, so
	// that the proxy gives up first.
	StopPastProxyFor = 20 * time.Second
	// ProxyRestarts is how many times proxy-restart kills the proxy.
	ProxyRestarts    = 4
	ProxyWaitAttempt = 30 * time.Second
)

// Scenarios returns the suite's scenarios; stops is how many times the
// SIGSTOP scenarios stop a replica.
func Scenarios(stops int) []Scenario {
	var s []Scenario
	for _, p := range []Proxy{HAProxy, Nginx} {
		s = append(s, Scenario{Name: "rolling-restart", Proxy: p, Fault: rollingRestart})
	}
	for _, p := range []Proxy{HAProxy, Nginx} {
		s = append(s, Scenario{Name: "sigstop-replica", Proxy: p, Fault: func(r *Run) { sigstop(r, stops) }})
	}
	s = append(s,
		Scenario{Name: "redis-restart-empty", Proxy: HAProxy, Resets: true, Fault: func(r *Run) {
			r.C.RedisKill()
			r.C.RedisStart()
			moveAfterStore(r)
		}},
		// A replica stopped past its claims while its sessions move and
		// go on elsewhere; then the store comes back empty, and the
		// stopped replica is continued with calls in flight: it must not
		// write its stale instances back over what the others
		// acknowledged (durable's newestHere).
		Scenario{Name: "sigstop-redis-empty", Proxy: HAProxy, Resets: true, Fault: func(r *Run) {
			r.C.Freeze(0)
			r.Hold(StopFor)
			r.C.RedisKill()
			r.C.RedisStart()
			r.C.Thaw(0)
			r.C.WaitRouted(0)
			r.Rounds(1)
			moveAfterStore(r)
		}},
		Scenario{Name: "redis-down-10s", Proxy: HAProxy, Fault: func(r *Run) {
			r.C.RedisKill()
			r.Hold(RedisDownFor)
			r.C.RedisStart()
			moveAfterStore(r)
		}},
		Scenario{Name: "redis-frozen", Proxy: HAProxy, Fault: func(r *Run) {
			r.C.RedisFreeze()
			r.Hold(RedisFreeze)
			r.C.RedisThaw()
			moveAfterStore(r)
		}},
		Scenario{Name: "redis-evicts-values", Proxy: HAProxy, Resets: true, Fault: evictValues},
	)
	for _, p := range []Proxy{HAProxy, Nginx} {
		s = append(s, Scenario{Name: "partition-store", Proxy: p, Relays: true, StoreLinks: true, SoakOnly: p == Nginx, Fault: partitionStore})
	}
	s = append(s,
		Scenario{Name: "partition-store-unrouted", Proxy: HAProxy, Relays: true, StoreLinks: true, SoakOnly: true, Fault: partitionUnrouted},
		Scenario{Name: "partition-store-flapping", Proxy: HAProxy, StoreLinks: true, SoakOnly: true, Fault: partitionFlapping},
		Scenario{Name: "slow-store-link", Proxy: HAProxy, StoreLinks: true, SoakOnly: true, Fault: slowStoreLink},
		Scenario{Name: "slow-store", Proxy: HAProxy, StoreLinks: true, SoakOnly: true, Fault: slowStore},
		Scenario{Name: "kill9-under-load", Proxy: HAProxy, Fault: func(r *Run) {
			for _, i := range []int{0, 1} {
				r.C.Kill(i)
				r.C.WaitDown(i)
				r.Rounds(1)
				r.C.Start(i)
				r.Rounds(1)
			}
		}},
		Scenario{Name: "kill9-slow-calls", Proxy: HAProxy, Slow: true, Steps: DrainCallSteps, Fault: killDuringSlowCalls},
	)
	for _, p := range []Proxy{HAProxy, Nginx} {
		s = append(s, Scenario{Name: "kill9-after-checkpoint", Proxy: p, Relays: true, Fault: killAfterCheckpoint})
	}
	s = append(s,
		Scenario{Name: "redis-failover", Proxy: HAProxy, Sentinel: true, Fault: redisFailover},
		Scenario{Name: "redis-failover-silent", Proxy: HAProxy, Sentinel: true, Fault: redisFailoverSilent},
	)
	// Combinations of the faults above that no scenario before made.
	for _, p := range []Proxy{HAProxy, Nginx} {
		s = append(s, Scenario{Name: "sigstop-past-proxy", Proxy: p, SoakOnly: true, Attempt: ProxyWaitAttempt, Fault: sigstopPastProxy})
	}
	for _, p := range []Proxy{HAProxy, Nginx} {
		s = append(s, Scenario{Name: "unrouted-replica", Proxy: p, Relays: true, SoakOnly: p == Nginx, Fault: unroutedReplica})
	}
	s = append(s,
		Scenario{Name: "kill9-mid-drain", Proxy: HAProxy, Fault: killMidDrain},
		Scenario{Name: "kill9-mid-drain-calls", Proxy: HAProxy, Slow: true, Steps: DrainCallSteps, Fault: killDrainingWithCalls},
		Scenario{Name: "redis-frozen-rolling-restart", Proxy: HAProxy, SoakOnly: true, Fault: redisFrozenRollingRestart},
		// sigstop-redis-empty with the store back empty at once: no one
		// can take the stopped replica's sessions over meanwhile (the
		// store holds none, and came back empty lately), and the
		// replica, continued, cannot tell that no one did.
		Scenario{Name: "sigstop-store-empty-at-once", Proxy: HAProxy, Resets: true, SoakOnly: true, Fault: func(r *Run) {
			i := r.servingReplica(-1)
			r.C.Freeze(i)
			r.C.RedisKill()
			r.C.RedisStart()
			r.Hold(StopFor)
			r.C.Thaw(i)
			r.C.WaitRouted(i)
			r.Rounds(1)
			moveFrom(r, i)
		}},
		// A rolling restart whose drain meets the store lost: Redis killed
		// and restarted empty as the replica drains, at each of
		// RedisEmptyDrainAt.
		Scenario{Name: "redis-empty-mid-drain", Proxy: HAProxy, Resets: true, SoakOnly: true, Fault: redisEmptyMidDrain},
	)
	for _, p := range []Proxy{HAProxy, Nginx} {
		s = append(s, Scenario{Name: "proxy-restart", Proxy: p, SoakOnly: p == Nginx, Fault: proxyRestart})
	}
	s = append(s,
		Scenario{Name: "mismatched-state-key", Proxy: HAProxy, Fault: mismatchedKey},
		// One machine: one replica and the embedded store, killed (-9)
		// under load and between a checkpoint and its answer.
		Scenario{Name: "file-store-kill9", Proxy: Direct, Relays: true, FileStore: true, Down: []int{1, 2}, Fault: fileStoreKill},
		Scenario{Name: "file-store-restart", Proxy: Direct, FileStore: true, Down: []int{1, 2}, Fault: func(r *Run) {
			for range 3 {
				r.C.Term(0)
				r.C.Start(0)
				r.Rounds(1)
			}
		}},
		// The one machine's replica stopped (SIGSTOP) past its lease and
		// heartbeat, twice: no one else could take its sessions, and the
		// requests its clients gave up on wait in its sockets.
		Scenario{Name: "file-store-sigstop", Proxy: Direct, FileStore: true, Down: []int{1, 2}, SoakOnly: true, Fault: func(r *Run) {
			for range 2 {
				r.C.Freeze(0)
				r.Hold(StopFor)
				r.C.Thaw(0)
				r.Rounds(1)
			}
		}},
		Scenario{Name: "scale-out-in", Proxy: HAProxy, Down: []int{2}, Fault: func(r *Run) {
			r.C.Start(2) // 2 → 3 replicas
			r.Rounds(2)
			r.C.Term(0) // 3 → 2: s1 drained and gone
			r.C.WaitDown(0)
		}},
	)
	return s
}

// moveAfterStore checks that sessions recovered from a store fault by
// themselves: two rounds, then s1 drains and restarts, so that its
// sessions move to their fallbacks and back, through the store.
func moveAfterStore(r *Run) { moveFrom(r, 0) }

// moveFrom is [moveAfterStore] with replica i drained.
func moveFrom(r *Run, i int) {
	r.Rounds(2)
	r.C.Term(i)
	r.C.WaitDown(i)
	r.Rounds(1)
	r.C.Start(i)
}

// killFrom is [moveFrom] with replica i killed (-9), at once: its
// sessions go on elsewhere from what the store holds, not from its memory
// (a drain writes them back first).
func killFrom(r *Run, i int) {
	r.C.Kill(i)
	r.C.WaitDown(i)
	r.Rounds(1)
	r.C.Start(i)
}

// partitionStore cuts a replica that serves sessions off from Redis
// (blackholed: nothing refused, nothing answered) for PartitionFor, while
// the proxy, the other replicas and Redis reach one another: split brain.
// The proxy sends the replica its sessions throughout (it stays ready: it
// cannot tell this from Redis down for every replica). It serves them
// from memory within 2 s of its last verified claim; past them it refuses
// their calls with 503 before they run, and the proxy sends each to the
// session's fallback, which takes the session over from the store once
// the replica's heartbeat has expired (until then it refuses -32053).
// After PartitionAlone a round of every client must go by: every session
// of the cut-off replica goes on elsewhere (until the 503s, the scenario
// had to refuse the replica's port for it). Later calls of those sessions
// still reach the cut-off replica first, which holds their stale
// instances and must not serve them. Then the partition heals: what the
// replica sent during it reaches Redis late (its claims, its writes), and
// must not overwrite what the others acknowledged; and the replica is
// drained, so that its sessions move again through the store.
func partitionStore(r *Run) {
	i := r.servingReplica(-1)
	cut := time.Now()
	r.C.Cut(i)
	r.Hold(PartitionAlone)
	r.Rounds(1)
	r.Hold(max(PartitionFor-time.Since(cut), 2*time.Second))
	r.C.Heal(i)
	r.Rounds(1)
	moveFrom(r, i)
}

// SlowFor is how long the slow-store scenarios keep a link slow, and
// SlowLink how slow: each send waits 0.35 to 0.7 s, so an exchange with
// Redis takes 0.7 to 1.4 s more, around the replicas' 1 s bound on it:
// some answer in time, others time out and their writes land after.
const (
	SlowFor  = 10 * time.Second
	SlowLink = 700 * time.Millisecond
)

// slowStoreLink makes one serving replica's link to Redis slow for
// SlowFor, then fast again: its exchanges with the store answer late or
// time out, writes reported failed land later (a holder bumps its fence
// before its next write), its breaker opens and shuts, and its clients'
// calls go on from memory marked notSaved, or are handed to a fallback
// that reaches the store. Then it is drained.
func slowStoreLink(r *Run) {
	i := r.servingReplica(-1)
	r.C.SlowStore(i, SlowLink)
	r.Hold(SlowFor)
	r.C.SlowStore(i, 0)
	r.Rounds(1)
	moveFrom(r, i)
}

// slowStore makes every replica's link to Redis slow for SlowFor: no
// replica reaches the store in time for some exchanges, so no hand-over
// helps; calls go on from memory marked notSaved, or are refused with
// -32053, until the links are fast again.
func slowStore(r *Run) {
	for i := range r.C.Replicas {
		r.C.SlowStore(i, SlowLink)
	}
	r.Hold(SlowFor)
	for i := range r.C.Replicas {
		r.C.SlowStore(i, 0)
	}
	r.Rounds(1)
}

// partitionUnrouted is [partitionStore] with the proxy failing the cut-off
// replica over as well (its port refuses the proxy) for the round after
// PartitionAlone, then routing its sessions back to it, still cut off.
func partitionUnrouted(r *Run) {
	i := r.servingReplica(-1)
	cut := time.Now()
	r.C.Cut(i)
	r.Hold(PartitionAlone)
	r.C.Unroute(i)
	r.C.WaitDown(i)
	r.Rounds(1)
	r.C.Reroute(i)
	r.Hold(max(PartitionFor-time.Since(cut), 2*time.Second))
	r.C.Heal(i)
	r.Rounds(1)
	moveFrom(r, i)
}

// FlapFor are the lengths of partition-store-flapping's cuts.
var FlapFor = []time.Duration{1 * time.Second, 3 * time.Second, 1500 * time.Millisecond, 2500 * time.Millisecond, 2 * time.Second}

// partitionFlapping cuts a replica that serves sessions off from Redis
// and heals it again, FlapFor each time with a round of every client
// between, while the proxy sends it its sessions throughout: around its
// 2 s of grace and its 2.5 s lease, each cut's store exchanges time out
// or arrive late. Then it is drained, so that its sessions move through
// the store.
func partitionFlapping(r *Run) {
	i := r.servingReplica(-1)
	for _, d := range FlapFor {
		r.C.Cut(i)
		r.Hold(d)
		r.C.Heal(i)
		r.Rounds(1)
	}
	moveFrom(r, i)
}

// evictValues deletes the sessions' out-of-line values under load, three
// times, a round of every client after each: a record whose value is gone
// is dropped by the next script that meets it, and its holder writes the
// session back. Then the sessions move, so that another replica reads
// what was written back. It fails the run if there was nothing to evict.
func evictValues(r *Run) {
	evicted := 0
	for range 3 {
		evicted += r.C.RedisEvictValues()
		r.Rounds(1)
	}
	if evicted == 0 {
		r.T.Fatal("no value kept out of line to evict: the scenario tests nothing")
	}
	moveAfterStore(r)
}

// redisFailover kills (-9) the Redis primary under load: the sentinels
// promote its replica, and the replicas, asking them, follow. Once every
// sentinel has switched, the old primary comes back empty as a replica of
// the new one (never as a primary, whose emptiness its replica would
// copy); until then, with wait_replicas=1, no write is acknowledged.
// Then a replica that serves sessions is killed (-9), so that its
// sessions go on elsewhere from what the new primary holds, not from its
// memory (a drain would write them back).
func redisFailover(r *Run) {
	r.C.PrimaryKill()
	r.C.WaitFailover()
	r.C.RejoinOldPrimary()
	r.Rounds(1)
	killFrom(r, r.servingReplica(-1))
}

// redisFailoverSilent is the failover that loses writes a primary
// acknowledged before its replica had them: the replication link goes
// silent (a relay swallows the primary's stream and the replica's
// acknowledgements, the connections left open) for ReplicationSilentFor
// under load, then the primary and a replica that serves sessions are
// killed (-9) together, as one host lost, and the sentinels, which reach
// the replica directly, promote it. The killed replica's sessions go on
// elsewhere from what the new primary holds: with wait_replicas=1 no
// write of the silence was acknowledged (WAIT timed out: the store
// reports it failed), so nothing acknowledged is lost; without
// (FAULTS_NO_WAIT=1) what was acknowledged during the silence is.
// The old primary rejoins, empty, as a replica of the new one, at once:
// until then, with wait_replicas=1, no write is acknowledged. The killed
// replica is started again after a round of every client.
func redisFailoverSilent(r *Run) {
	i := r.servingReplica(-1)
	r.C.SilenceReplication()
	r.Hold(ReplicationSilentFor)
	r.C.Kill(i)
	r.C.PrimaryKill()
	r.C.WaitFailover()
	r.C.RejoinOldPrimary()
	r.C.WaitDown(i)
	r.Rounds(1)
	r.C.Start(i)
}

// rollingRestart drains (SIGTERM) and restarts each replica in turn,
// a round of every client between steps.
func rollingRestart(r *Run) {
	rollingRestartWith(r, func(i int) { r.C.Term(i) })
}

// rollingRestartWith is [rollingRestart] with each replica stopped by
// stop (which returns once it has exited).
func rollingRestartWith(r *Run, stop func(i int)) {
	for i := range r.C.Replicas {
		stop(i)
		r.backAfterRound(i)
	}
}

// sigstop stops each replica in turn (stops times in all) past the claim
// timeouts, then continues it.
func sigstop(r *Run, stops int) {
	for k := range stops {
		i := k % len(r.C.Replicas)
		r.C.Freeze(i)
		r.Hold(StopFor)
		r.C.Thaw(i)
		r.C.WaitRouted(i)
		r.Rounds(1)
	}
}

// killDuringSlowCalls kills (-9) the replica of a client whose slow call
// has changed its state and works on (its first progress report), twice,
// restarting it after each, and up to twice more until one kill has cut
// an add of the client that reported: on a quiet machine a call can end
// in the milliseconds between its report and the kill it sets off (CI
// read none of 2 cut once, in the stop after 74).
func killDuringSlowCalls(r *Run) {
	cut := 0
	for k := 0; k < 4 && (k < 2 || cut == 0); k++ {
		i, n := r.replicaOfProgress()
		rep := r.C.Replicas[i]
		r.C.Logf("a slow call on %s reported progress", rep.Name)
		at := time.Now()
		r.C.Kill(i)
		r.C.WaitDown(i)
		r.Rounds(1)
		r.C.Start(i)
		r.Rounds(1)
		if r.addCutAt(n, at) {
			cut++
			r.C.Logf("the kill of %s cut an add of c%d", rep.Name, n)
		}
	}
	if cut == 0 {
		r.T.Errorf("no kill of 4 at a progress report cut an add of the client that reported it")
	}
}

// fileStoreKill kills (-9) the one replica of a machine that keeps its
// sessions in the embedded store, four times in turn: under load, and
// once a note_add's answer has left it (its checkpoint written and
// synced to the file), as killAfterCheckpoint does; each time it is
// started again on the same file, and its clients, their calls failed
// meanwhile, go on there.
func fileStoreKill(r *Run) {
	const i = 0
	for k := range 4 {
		if k%2 == 0 {
			r.C.Kill(i)
		} else {
			r.killAnswered(i)
		}
		r.C.WaitDown(i)
		r.C.Start(i)
		r.Rounds(1)
	}
}

// replicaOfProgress returns the replica of the first slow call to report
// progress after now (its session's), and its client.
func (r *Run) replicaOfProgress() (i, n int) {
	r.DrainProgress()
	for i = -1; i < 0; {
		n = r.Progress()
		i = r.ReplicaOf(n)
	}
	return i, n
}

// killAfterCheckpoint kills (-9) a replica once a note_add's answer has
// left it (so its state is in the store) and before the proxy got it:
// the proxy sees a connection closed without an answer. Two replicas in
// turn, each one that some client's session was minted on: HAProxy sends
// a session to the replica its ID names, so a replica that minted none
// (new sessions are balanced round robin, and six need not reach all
// three) would never see a note_add.
func killAfterCheckpoint(r *Run) {
	killed := -1
	for range 2 {
		i := r.servingReplica(killed)
		r.killAnswered(i)
		r.C.WaitDown(i)
		r.Rounds(1)
		r.C.Start(i)
		r.Rounds(1)
		killed = i
	}
}

// killAnswered kills (-9) replica i once a note_add's answer has left
// it, before its relay passed it on, and waits for it to exit.
func (r *Run) killAnswered(i int) {
	rep := r.C.Replicas[i]
	done := rep.Relay.Trap(`"note_add"`, func() { rep.proc.Signal(syscall.SIGKILL) })
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		r.T.Fatalf("no note_add reached %s in 2 minutes", rep.Name)
	}
	r.C.waitExit(i)
	r.C.Logf("%s killed (-9) between a note_add's checkpoint and its answer", rep.Name)
}

// servingReplica returns the lowest-numbered replica, other than not,
// that minted some client's session; if only not did, not.
func (r *Run) servingReplica(not int) int {
	minted := make([]bool, len(r.C.Replicas))
	for n := range r.Clients {
		if i := r.ReplicaOf(n); i >= 0 {
			minted[i] = true
		}
	}
	for i, ok := range minted {
		if ok && i != not {
			return i
		}
	}
	if not >= 0 && minted[not] {
		return not
	}
	r.T.Fatal("no client has a session yet")
	return -1
}

// mismatchedKey restarts s3 with another WASMTOOLS_STATE_KEY: it must
// not become ready, and must say why in /readyz ("state key mismatch"),
// watched for BadKeyWatch while the clients run; no session may be lost
// through it. Then s3 comes back with the right key.
func mismatchedKey(r *Run) {
	const i = 2
	r.C.Term(i)
	r.C.WaitDown(i)
	r.C.StartWithKey(i, "another state key")
	rep := r.C.Replicas[i]
	deadline := time.Now().Add(BadKeyWatch)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	said := false
	for time.Now().Before(deadline) && rep.Running() {
		code, body := r.C.Readyz(i)
		if code == http.StatusOK {
			r.Violate(Ready, fmt.Sprintf("%s, started with another state key than the store's, answers /readyz 200 %q", rep.Name, body))
			r.C.Logf("%s ready with the wrong key", rep.Name)
			break
		}
		if !said && strings.Contains(body, "state key") {
			said = true
			r.C.Logf("%s not ready: %s", rep.Name, strings.TrimSpace(body))
		}
		<-tick.C
	}
	if !said && rep.Running() {
		r.Violate(Ready, fmt.Sprintf("%s, started with another state key, did not say why in /readyz within %v", rep.Name, BadKeyWatch))
	}
	r.Rounds(1)
	if rep.Running() {
		r.C.Term(i)
	}
	r.C.WaitDown(i)
	r.C.Start(i)
}

// sigstopPastProxy stops a replica that serves sessions for
// StopPastProxyFor, while its clients wait ProxyWaitAttempt for each
// attempt: the proxy, not the client, gives up on the requests the
// stopped replica holds, and sends them on to the session's fallback,
// which takes the session over and runs them; the requests are still in
// the stopped replica's sockets when it is continued. Each call must
// apply once (the keyless clients' too: the proxy's resend is the same
// POST), and the continued replica must not serve its stale instances.
// Then it is drained, so that its sessions move through the store.
func sigstopPastProxy(r *Run) {
	i := r.servingReplica(-1)
	r.C.Freeze(i)
	r.Hold(StopPastProxyFor)
	r.C.Thaw(i)
	r.C.WaitRouted(i)
	r.Rounds(1)
	moveFrom(r, i)
}

// KillDrainAt are the moments kill9-mid-drain kills a draining replica:
// 0 as soon as the proxy saw it unready (in its drain delay, 1 s, its
// sessions' requests still served there), the others that long after its
// drain began: about as the delay ends (it begins to refuse requests,
// waits for its calls, writes and releases its sessions) and past it.
var KillDrainAt = []time.Duration{0, 950 * time.Millisecond, 1050 * time.Millisecond, 1200 * time.Millisecond}

// killMidDrain interrupts a rolling restart: a replica that serves
// sessions is sent SIGTERM and killed (-9) while it drains, at each of
// KillDrainAt, a round of every client after each kill and after each
// start. Its sessions go on elsewhere from the store; its claims not yet
// released are waited out.
func killMidDrain(r *Run) {
	i := r.servingReplica(-1)
	for _, after := range KillDrainAt {
		rep := r.C.Replicas[i]
		r.C.TermNoWait(i)
		if after == 0 {
			r.C.WaitDown(i)
		} else {
			rep.proc.WaitOutput(10*time.Second, func(out string) bool { return strings.Contains(out, "msg=draining") })
			time.Sleep(after) // the fault's timing, not a wait for a state
		}
		r.C.KillIfRunning(i)
		r.backAfterRound(i)
	}
}

// DrainCallSteps is slow_add's steps in kill9-mid-drain-calls and
// kill9-slow-calls: with the suite's 20 a call ends within milliseconds
// of its first progress report, before the kill it sets off lands.
const DrainCallSteps = 500

// killDrainingWithCalls is kill9-mid-drain with a call running at the
// draining replica when it is killed, which kill9-mid-drain's fixed
// moments and its clients' short calls seldom meet: the clients call
// slownotes' slow_add, the replica is sent SIGTERM as one of its calls
// reports progress, and killed (-9) at the first progress report of one
// of its calls after its drain began (within its drain delay, where it
// still serves its sessions' requests), three times; one kill at least
// must cut an add of the client that reported (slow_add's
// DrainCallSteps keep it running that long, most times). A drain that
// ends first is killed as it exits, and the run says so.
func killDrainingWithCalls(r *Run) {
	cut := 0
	for range 3 {
		i, _ := r.replicaOfProgress()
		rep := r.C.Replicas[i]
		r.C.TermNoWait(i)
		rep.proc.WaitOutput(10*time.Second, func(out string) bool { return strings.Contains(out, "msg=draining") })
		r.DrainProgress()
		inFlight, n := false, -1
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
			var ok bool
			if n, ok = r.progressWithin(time.Until(deadline)); ok && r.ReplicaOf(n) == i {
				inFlight = true
				break
			}
		}
		at := time.Now()
		r.C.KillIfRunning(i)
		r.C.Logf("%s killed (-9) draining, a call of its running: %v", rep.Name, inFlight)
		r.backAfterRound(i)
		// A progress report says only that a call was running a moment
		// before: one that ended before the kill leaves this scenario
		// kill9-mid-drain's.
		if inFlight && r.addCutAt(n, at) {
			cut++
			r.C.Logf("the kill of %s cut an add of c%d", rep.Name, n)
		}
	}
	if cut == 0 {
		r.T.Errorf("no kill of 3 at a progress report cut an add of the client that reported it")
	}
}

// addCutAt says whether an add attempt of client n that began before at
// failed after it: a call the fault at that moment cut.
func (r *Run) addCutAt(n int, at time.Time) bool {
	for _, op := range r.Clients[n].History() {
		if op.Kind == "add" && op.Start.Before(at) && op.End.After(at) && !op.OK() {
			return true
		}
	}
	return false
}

// backAfterRound waits until the proxy sees replica i down, then for a
// round of every client without it, starts it again, and waits for
// another round.
func (r *Run) backAfterRound(i int) {
	r.C.WaitDown(i)
	r.Rounds(1)
	r.C.Start(i)
	r.Rounds(1)
}

// redisFrozenRollingRestart is a rolling restart with Redis stopped
// (SIGSTOP) around each drain, past the replicas' store timeouts and
// their grace: stopped 3 s before the replica's SIGTERM, continued 4 s
// into its drain (its 1 s drain delay, then its calls, its writes, its
// releases; the sessions made at it while Redis was stopped have no
// record yet). A stall shorter than the drain's time (the drain delay
// and --shutdown-grace, 11 s) must lose nothing: each session's next
// request reaches another replica, which takes it over from the store.
func redisFrozenRollingRestart(r *Run) {
	rollingRestartWith(r, func(i int) {
		r.C.RedisFreeze()
		r.Hold(3 * time.Second)
		r.C.TermNoWait(i)
		r.Hold(4 * time.Second)
		r.C.RedisThaw()
		r.C.WaitExit(i)
	})
}

// unroutedReplica fails a replica that serves sessions over at the proxy
// alone (its port refuses the proxy's connections and health checks),
// while it runs on and reaches Redis, its heartbeat and its claims alive:
// its sessions' fallbacks take them over from the store. Then it is
// routed again, and its sessions come back to it, where it holds their
// stale instances: it must serve them from the store. Then it is drained.
func unroutedReplica(r *Run) {
	i := r.servingReplica(-1)
	r.C.Unroute(i)
	r.C.WaitDown(i)
	r.Rounds(2)
	r.C.Reroute(i)
	r.Rounds(2)
	moveFrom(r, i)
}

// proxyRestart kills the proxy (-9) under load, as a proxy's pod or host
// lost, and starts it again at once at its address, ProxyRestarts times,
// a round of every client after each start: every call in flight through
// it is cut, whether or not its replica ran it, and every 2025-11-25
// standing stream, which its client resumes at the session's replica.
func proxyRestart(r *Run) {
	for range ProxyRestarts {
		r.C.ProxyKill()
		r.C.ProxyStart()
		r.Rounds(1)
	}
}

// RedisEmptyDrainAt are the moments redis-empty-mid-drain kills Redis
// after a replica's drain began: in its drain delay (1 s, its sessions
// still served there), and about as the delay ends, when it saves and
// releases its sessions.
var RedisEmptyDrainAt = []time.Duration{0, 1000 * time.Millisecond, 1100 * time.Millisecond}

// redisEmptyMidDrain sends a replica that serves sessions SIGTERM and,
// while it drains, kills Redis and starts it again empty, at each of
// RedisEmptyDrainAt, a round of every client after the replica exits and
// after it is back. The drain's saves and releases meet a store that
// lost every record: the draining replica must write its sessions back
// (or say them lost), so that their next replica finds them; the others
// go on from memory. A stateReset is allowed (the store's data is gone);
// a session ended or a note lost unsaid is not.
func redisEmptyMidDrain(r *Run) {
	for _, after := range RedisEmptyDrainAt {
		i := r.servingReplica(-1)
		rep := r.C.Replicas[i]
		r.C.TermNoWait(i)
		rep.proc.WaitOutput(10*time.Second, func(out string) bool { return strings.Contains(out, "msg=draining") })
		time.Sleep(after) // the fault's timing, not a wait for a state
		r.C.RedisKill()
		r.C.RedisStart()
		r.C.WaitExit(i)
		r.backAfterRound(i)
	}
}
