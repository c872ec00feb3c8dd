package statestore

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// mtlsServer is a Redis's TLS, asking its clients for a certificate from
// ca (tls-auth-clients yes, Redis's default), its own naming 127.0.0.1.
func mtlsServer(t *testing.T, ca *proxytest.CA) *proxytest.ServerTLS {
	cert, key := ca.Issue(t, "127.0.0.1")
	return &proxytest.ServerTLS{CA: ca, Cert: cert, Key: key, AuthClients: true}
}

// mtlsWorks checks the store at url opens and keeps a session (Claim,
// Put, Get), and returns it.
func mtlsWorks(t *testing.T, url string) *Redis {
	t.Helper()
	r, err := NewRedis(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	mtlsExchange(t, r, "s")
	return r
}

// mtlsExchange claims the session id in r, puts a field and reads it
// back.
func mtlsExchange(t *testing.T, r *Redis, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := r.Claim(ctx, id, Owner{Replica: "a", Boot: "b"}, time.Minute, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Put(ctx, id, "f", []byte("v"), c.Fence, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Get(ctx, id); err != nil || !bytes.Equal(got["f"], []byte("v")) {
		t.Fatalf("Get: %q, %v; want f=v", got, err)
	}
}

// TestRedisMutualTLS: a Redis over TLS alone that asks for client
// certificates (tls-auth-clients yes) is reached with tls_cert_file and
// tls_key_file from a CA it trusts, its own certificate checked against
// tls_ca_file's CA alone (not among the system's); without a client
// certificate, or with another CA's, or without tls_ca_file, the store is
// refused at open, saying why. The same through Sentinel (master_name),
// the Sentinel asking for client certificates too.
func TestRedisMutualTLS(t *testing.T) {
	ca := proxytest.NewCA(t)
	s := mtlsServer(t, ca)
	addr, _ := proxytest.StartRedisTLS(t, s)
	cert, key := ca.Issue(t, "wasmtools")
	other := proxytest.NewCA(t)
	otherCert, otherKey := other.Issue(t, "wasmtools")
	mtls := "tls_cert_file=" + cert + "&tls_key_file=" + key
	refused := func(t *testing.T, url string, want ...string) {
		t.Helper()
		r, err := NewRedis(url)
		if err == nil {
			r.Close()
			t.Fatal("opened")
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: want an error saying %q", err, w)
			}
		}
	}
	base := "rediss://" + addr + "/0?tls_ca_file=" + ca.File

	t.Run("client certificate", func(t *testing.T) {
		mtlsWorks(t, base+"&"+mtls)
	})
	t.Run("no client certificate", func(t *testing.T) {
		refused(t, base, "the server asked for a client certificate, and the URL names none")
	})
	t.Run("another CA's client certificate", func(t *testing.T) {
		refused(t, base+"&tls_cert_file="+otherCert+"&tls_key_file="+otherKey, "was given tls_cert_file's")
	})
	t.Run("system CAs", func(t *testing.T) {
		refused(t, "rediss://"+addr+"/0?"+mtls, "x509: certificate signed by unknown authority")
	})
	t.Run("Sentinel", func(t *testing.T) {
		sentinelCert, sentinelKey := ca.Issue(t, "localhost")
		sentinel, _ := proxytest.StartSentinelTLS(t, "wt", addr, 0,
			&proxytest.ServerTLS{CA: ca, Cert: sentinelCert, Key: sentinelKey, AuthClients: true})
		url := "rediss://localhost:" + portOf(sentinel) + "/0?master_name=wt&tls_ca_file=" + ca.File
		mtlsWorks(t, url+"&"+mtls)
		refused(t, url, "the server asked for a client certificate, and the URL names none")
	})
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// TestRedisTLSRotation: the CA file and the client certificate are read
// again when they change on disk, at the next connection dialed, without
// reopening the store: after a Redis restarted with another CA, which
// trusts client certificates from it alone, the store goes on with the
// CA file and key pair rotated to it. A rotation half done (a certificate
// whose key is not there yet) and a CA file that is not PEM are logged,
// once, and the files read before kept until the next change.
func TestRedisTLSRotation(t *testing.T) {
	var logs proxytest.SyncBuffer
	tlsLog.Store(slog.New(slog.NewTextHandler(&logs, nil)))
	defer tlsLog.Store(nil)

	ca := proxytest.NewCA(t)
	s := mtlsServer(t, ca)
	addr, p := proxytest.StartRedisTLS(t, s)
	// The store's files, rotated in place (as a secret's mount is:
	// each file renamed over).
	dir := t.TempDir()
	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	rotate := func(to, from string) {
		t.Helper()
		b, err := os.ReadFile(from)
		if err == nil {
			err = os.WriteFile(to+".new", b, 0o600)
		}
		if err == nil {
			err = os.Rename(to+".new", to)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	cert, key := ca.Issue(t, "wasmtools")
	rotate(caFile, ca.File)
	rotate(certFile, cert)
	rotate(keyFile, key)
	r := mtlsWorks(t, "rediss://"+addr+"/0?tls_ca_file="+caFile+"&tls_cert_file="+certFile+"&tls_key_file="+keyFile)
	// redial closes the store's connections: its next exchange dials.
	redial := func() {
		t.Helper()
		if err := proxytest.RedisCommand(s.Dial(addr), "CLIENT KILL TYPE normal SKIPME yes", ":"); err != nil {
			t.Fatal(err)
		}
	}

	// The next CA, and a client certificate from it; the certificate
	// lands first, its key not yet.
	next := proxytest.NewCA(t)
	nextCert, nextKey := next.Issue(t, "wasmtools")
	rotate(certFile, nextCert)
	redial()
	mtlsExchange(t, r, "half-rotated")
	if n := strings.Count(logs.String(), "private key does not match public key"); n != 1 {
		t.Errorf("logged %d times that the key does not match, want once:\n%s", n, logs.String())
	}
	redial()
	mtlsExchange(t, r, "half-rotated-again")
	if n := strings.Count(logs.String(), "private key does not match public key"); n != 1 {
		t.Errorf("logged %d times that the key does not match, want once:\n%s", n, logs.String())
	}

	// The key lands, and the CA file; Redis restarts with the next CA,
	// trusting client certificates from it alone.
	rotate(keyFile, nextKey)
	rotate(caFile, next.File)
	p.Stop()
	s = mtlsServer(t, next)
	proxytest.StartRedisWith(t, s.Dial(addr), s.RedisArgs(addr)...)
	mtlsExchange(t, r, "rotated")
	for _, w := range []string{"client certificate changed: read again", "CA file changed: read again"} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("no %q in the log:\n%s", w, logs.String())
		}
	}

	// A CA file that is not PEM: the one read before is kept.
	if err := os.WriteFile(caFile, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	redial()
	mtlsExchange(t, r, "CA file bad")
	if !strings.Contains(logs.String(), `CA file is bad: the one read before is kept" error="tls_ca_file=\"`+caFile+`\": no PEM certificate`) {
		t.Errorf("the bad CA file not logged:\n%s", logs.String())
	}
}
