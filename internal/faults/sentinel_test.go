package faults

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSentinelFailover holds the Redis of redis-failover's scenarios to
// what they need, with a go-redis failover client as the replicas use:
// a write WAITed for while replication is silent reaches no replica,
// the sentinels promote the replica once the primary is killed, the
// client follows, and the write acknowledged before the silence is there
// and the one during it is not; the old primary rejoins as a replica of
// the new one, which WAIT then counts.
func TestSentinelFailover(t *testing.T) {
	c := &Cluster{t: t, setup: Setup{Sentinel: true}, begin: time.Now()}
	c.startSentinels()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: MasterName, SentinelAddrs: c.sent.addrs})
	defer rc.Close()
	write := func(key string) int64 {
		t.Helper()
		if err := rc.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		n, err := rc.Wait(ctx, 1, 500*time.Millisecond).Result()
		if err != nil {
			t.Fatalf("WAIT after SET %s: %v", key, err)
		}
		return n
	}
	if n := write("before"); n != 1 {
		t.Fatalf("WAIT 1 before the fault: %d replicas", n)
	}
	c.SilenceReplication()
	if n := write("during"); n != 0 {
		t.Fatalf("WAIT 1 while replication is silent: %d replicas, want 0", n)
	}
	c.PrimaryKill()
	c.WaitFailover()
	for key, want := range map[string]int64{"before": 1, "during": 0} {
		n, err := rc.Exists(ctx, key).Result()
		if err != nil || n != want {
			t.Errorf("EXISTS %s on the new primary: %d, %v; want %d", key, n, err, want)
		}
	}
	conf, err := rc.ConfigGet(ctx, "port").Result()
	if err != nil {
		t.Fatal(err)
	}
	if _, port, _ := net.SplitHostPort(c.Redis); conf["port"] != port {
		t.Errorf("the client talks to port %s, the new primary is %s", conf["port"], c.Redis)
	}
	c.RejoinOldPrimary()
	if n := write("after"); n != 1 {
		t.Errorf("WAIT 1 after the old primary rejoined: %d replicas", n)
		t.Log(c.sent.logs(30))
	}
}
