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
// that names neither address is refused, a Sentinel's or a primary's; one
// that names the URL's host alone is accepted, as it was before each was
// checked against its own (a name all the certificates share); one from
// another CA is refused whatever it names; skip_verify=true checks none.
func TestSentinelTLSChecksEachServer(t *testing.T) {
	ca := proxytest.NewCA(t)
	issue := func(ca *proxytest.CA, names ...string) *proxytest.ServerTLS {
		cert, key := ca.Issue(t, names...)
		return &proxytest.ServerTLS{CA: ca, Cert: cert, Key: key}
	}
	// open opens the store through the Sentinel at sentinel, named
	// localhost, trusting ca alone.
	open := func(sentinel, query string) (*Redis, error) {
		_, port, _ := net.SplitHostPort(sentinel)
		cfg, err := parseRedisURL("rediss://localhost:" + port + "/0?master_name=wt" + query)
		if err != nil {
			t.Fatal(err)
		}
		cfg.failover.TLSConfig.RootCAs = ca.Pool
		return newRedis(cfg)
	}
	works := func(t *testing.T, sentinel, query string) {
		r, err := open(sentinel, query)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := r.Claim(ctx, "s", Owner{Replica: "a", Boot: "b"}, time.Minute, true)
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
	}
	// refused checks the store is not opened through sentinel, and the
	// error says why (want).
	refused := func(t *testing.T, sentinel, want string) {
		r, err := open(sentinel, "")
		if err == nil {
			r.Close()
			t.Fatal("opened")
		}
		if !strings.Contains(err.Error(), "x509: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: want an x509 error with %q", err, want)
		}
	}
	// through starts a Sentinel, named localhost, of a primary over
	// TLS with s.
	through := func(t *testing.T, s *proxytest.ServerTLS) string {
		primary, _ := proxytest.StartRedisTLS(t, s)
		sentinel, _ := proxytest.StartSentinelTLS(t, "wt", primary, 0, issue(ca, "localhost"))
		return sentinel
	}
	primary, _ := proxytest.StartRedisTLS(t, issue(ca, "127.0.0.1"))

	t.Run("each its own name", func(t *testing.T) {
		sentinel, _ := proxytest.StartSentinelTLS(t, "wt", primary, 0, issue(ca, "localhost"))
		works(t, sentinel, "")
	})
	t.Run("Sentinel's naming neither", func(t *testing.T) {
		sentinel, _ := proxytest.StartSentinelTLS(t, "wt", primary, 0, issue(ca, "sentinel.invalid"))
		refused(t, sentinel, "not localhost")
	})
	t.Run("primary's naming neither", func(t *testing.T) {
		refused(t, through(t, issue(ca, "redis.invalid")), "for 127.0.0.1")
	})
	t.Run("primary's naming the URL's host", func(t *testing.T) {
		works(t, through(t, issue(ca, "localhost")), "")
	})
	t.Run("primary's from another CA", func(t *testing.T) {
		refused(t, through(t, issue(proxytest.NewCA(t), "127.0.0.1", "localhost")), "unknown authority")
	})
	t.Run("skip_verify", func(t *testing.T) {
		works(t, through(t, issue(proxytest.NewCA(t), "redis.invalid")), "&skip_verify=true")
	})
}
