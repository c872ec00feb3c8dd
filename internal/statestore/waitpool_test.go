package statestore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestWaitPooledConnectionsClosedAnswer: with wait_replicas=1, go-redis
// does not retry, so an exchange on a pooled connection the primary
// closed while it was idle fails (its outcome unknown, internal/durable's
// breaker open, calls notSaved) unless the pool finds the connection
// closed before it hands it out. Redis closes every client's connection
// when it restarts, and Sentinel has the old primary close them at a
// failover (CLIENT KILL TYPE normal, as here). The pool's check peeks at
// the socket, which a TLS connection does not give it: over TLS
// (rediss://) too, every exchange after the kill must be answered.
func TestWaitPooledConnectionsClosedAnswer(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	plain := proxytest.FreeAddr(t)
	secure := proxytest.FreeAddr(t)
	_, pport, _ := net.SplitHostPort(plain)
	_, sport, _ := net.SplitHostPort(secure)
	dial := func() (net.Conn, error) { return net.DialTimeout("tcp", plain, time.Second) }
	proxytest.StartRedisWith(t, dial, "--port", pport, "--bind", "127.0.0.1", "--tls-port", sport,
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert, "--tls-auth-clients", "no")
	proxytest.StartRedisReplica(t, plain)

	for _, c := range []struct{ name, url string }{
		{"tcp", "redis://" + plain + "/0?wait_replicas=1"},
		{"tls", "rediss://" + secure + "/0?wait_replicas=1&skip_verify=true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := openURL(t, c.url)
			bg := context.Background()
			// Several pooled connections: exchanges at once.
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					o := statestore.Owner{Replica: fmt.Sprint("warm", i), Boot: "b"}
					for range 5 {
						if err := s.Heartbeat(bg, o, time.Minute); err != nil {
							t.Error(err)
						}
						if _, err := s.Get(bg, o.Replica); err != nil && !errors.Is(err, statestore.ErrNotFound) {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			if err := proxytest.RedisCommand(dial, "CLIENT KILL TYPE normal", ":"); err != nil {
				t.Fatal(err)
			}
			failed := 0
			for i := range 20 {
				ctx, cancel := context.WithTimeout(bg, 2*time.Second)
				err := s.Heartbeat(ctx, ownerA, time.Minute)
				if err != nil {
					failed++
					t.Logf("write %d after the kill: %v", i, err)
				}
				if _, err := s.Get(ctx, "nothing"); err != nil && !errors.Is(err, statestore.ErrNotFound) {
					failed++
					t.Logf("read %d after the kill: %v", i, err)
				}
				cancel()
			}
			if failed > 0 {
				t.Errorf("%d of 40 exchanges after the primary closed its clients' connections failed, want 0", failed)
			}
		})
	}
}

// selfSigned writes a certificate for 127.0.0.1, its own CA, and its key
// into dir.
func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	must(t, err)
	kd, err := x509.MarshalECPrivateKey(k)
	must(t, err)
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	must(t, os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	must(t, os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600))
	return cert, key
}
