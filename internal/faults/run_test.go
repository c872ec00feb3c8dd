package faults

import (
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/durable"
)

// storeBreakers names, in the timeline, each replica whose store breaker
// opened, when (on the cluster's clock) and on what error, with the calls
// it served from memory; a replica whose never did is not named.
func TestStoreBreakersInTimeline(t *testing.T) {
	begin := time.Date(2026, 12, 7, 19, 53, 25, 0, time.UTC)
	c := &Cluster{begin: begin}
	for i := range c.Replicas {
		c.Replicas[i] = &Replica{Name: []string{"s1", "s2", "s3"}[i]}
	}
	c.Replicas[0].logs.WriteString(`time=2026-12-07T19:53:26.000Z level=INFO msg="serving MCP over streamable HTTP"` + "\n")
	c.Replicas[1].logs.WriteString(`time=2026-12-07T19:53:53.580Z level=WARN msg="` + durable.BreakerOpened + `" component=durable error="context deadline exceeded" for=2s` + "\n" +
		`time=2026-12-07T19:53:53.600Z level=WARN msg="` + durable.ServingFromMemory + `" component=durable session=handle-1 error="x"` + "\n" +
		`time=2026-12-07T19:53:53.700Z level=WARN msg="` + durable.ServingFromMemory + `" component=durable session=handle-2 error="x"` + "\n")
	c.storeBreakers()
	got := strings.Join(c.Timeline(), "\n")
	if want := "s2: store breaker opened 1× at 28.58s (context deadline exceeded); 2 calls served from memory"; !strings.Contains(got, want) || strings.Contains(got, "s1:") || strings.Contains(got, "s3:") {
		t.Fatalf("timeline:\n%s\nwant a line %q, and none of s1 or s3", got, want)
	}
}

// A setup naming two stores is refused rather than run on one of them:
// startProcess's store is a StoreLink's Redis before the sentinels, and
// either before the file, so a FileStore scenario with StoreLinks (or
// Sentinel) kept its sessions in Redis, and one with StoreLinks and
// Sentinel reached the first primary past its sentinels. Every
// scenario of the suite names one.
// TestSetupFileStoreStartsOneReplica: a FileStore setup is valid only
// with the other two replicas Down: the embedded store's file is locked
// by the process that opened it, so a second replica started with the
// cluster fails to start (or, were the lock lost, two processes would
// write one file), rather than the scenario's fault being what fails.
func TestSetupFileStoreStartsOneReplica(t *testing.T) {
	for _, down := range [][]int{nil, {1}, {2}, {1, 1}, {1, 5}} {
		if err := (Setup{FileStore: true, Down: down}).Validate(); err == nil {
			t.Errorf("FileStore, Down %v: valid; want an error", down)
		}
	}
	for _, down := range [][]int{{1, 2}, {2, 1}, {0, 2}, {0, 1}} {
		if err := (Setup{FileStore: true, Down: down}).Validate(); err != nil {
			t.Errorf("FileStore, Down %v: %v; want valid", down, err)
		}
	}
	if err := (Setup{Down: []int{1, 2}}).Validate(); err != nil {
		t.Errorf("Redis, Down [1 2]: %v; want valid", err)
	}
}

func TestSetupNamesOneStore(t *testing.T) {
	for _, s := range []Setup{
		{FileStore: true, StoreLinks: true},
		{FileStore: true, Sentinel: true},
		{StoreLinks: true, Sentinel: true},
		{FileStore: true, StoreLinks: true, Sentinel: true},
	} {
		if err := s.Validate(); err == nil {
			t.Errorf("FileStore %v, StoreLinks %v, Sentinel %v: valid; want an error", s.FileStore, s.StoreLinks, s.Sentinel)
		}
	}
	for _, s := range []Setup{{}, {FileStore: true, Relays: true, Down: []int{1, 2}}, {StoreLinks: true, Relays: true}, {Sentinel: true, NoWait: true}, {NoWait: true}} {
		if err := s.Validate(); err != nil {
			t.Errorf("%+v: %v; want valid", s, err)
		}
	}
	for _, sc := range Scenarios(1) {
		if err := sc.setup(Setup{NoWait: true}).Validate(); err != nil {
			t.Errorf("scenario %s/%s: %v", sc.Name, sc.Proxy, err)
		}
	}
}
