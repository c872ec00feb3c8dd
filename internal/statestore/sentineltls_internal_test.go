package statestore

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestSentinelTLSChecksEachServer: over rediss:// with master_name, each
// server's certificate is checked against the address the store dials:
// the Sentinel's against the URL's host name (localhost), the primary's
// against the IP Sentinel gives for it (127.0.0.1). Neither certificate
// names the other's address, as a deployment's need not. A certificate
// that names neither address is refused, a Sentinel's or a primary's.
func TestSentinelTLSChecksEachServer(t *testing.T) {
	ca := proxytest.NewCA(t)
	issue := func(names ...string) *proxytest.ServerTLS {
		cert, key := ca.Issue(t, names...)
		return &proxytest.ServerTLS{CA: ca, Cert: cert, Key: key}
	}
	// open opens the store through the Sentinel at sentinel, named
	// localhost, trusting ca alone.
	open := func(sentinel string) (*Redis, error) {
		_, port, _ := net.SplitHostPort(sentinel)
		cfg, err := parseRedisURL("rediss://localhost:" + port + "/0?master_name=wt")
		if err != nil {
			t.Fatal(err)
		}
		cfg.failover.TLSConfig.RootCAs = ca.Pool
		return newRedis(cfg)
	}
	// refused checks the store is not opened through sentinel, its
	// certificate checked against the address dialed, host.
	refused := func(t *testing.T, sentinel, host string) {
		r, err := open(sentinel)
		if err == nil {
			r.Close()
			t.Fatal("opened")
		}
		if !strings.Contains(err.Error(), "x509: ") || !strings.Contains(err.Error(), host) {
			t.Errorf("%v: want a certificate name mismatch with %s", err, host)
		}
	}
	primary, _ := proxytest.StartRedisTLS(t, issue("127.0.0.1"))

	t.Run("each its own name", func(t *testing.T) {
		sentinel, _ := proxytest.StartSentinelTLS(t, "wt", primary, 0, issue("localhost"))
		r, err := open(sentinel)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := r.Claim(ctx, "s", Owner{Replica: "a", Boot: "b"}, time.Minute, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Put(ctx, "s", "f", []byte("v"), c.Fence, time.Minute); err != nil {
			t.Fatal(err)
		}
		got, err := r.Get(ctx, "s")
		if err != nil || !bytes.Equal(got["f"], []byte("v")) {
			t.Fatalf("Get: %q, %v; want f=v", got, err)
		}
	})
	t.Run("Sentinel's naming neither", func(t *testing.T) {
		sentinel, _ := proxytest.StartSentinelTLS(t, "wt", primary, 0, issue("sentinel.invalid"))
		refused(t, sentinel, "not localhost")
	})
	t.Run("primary's naming neither", func(t *testing.T) {
		other, _ := proxytest.StartRedisTLS(t, issue("redis.invalid"))
		sentinel, _ := proxytest.StartSentinelTLS(t, "wt", other, 0, issue("localhost"))
		refused(t, sentinel, "for 127.0.0.1")
	})
}
