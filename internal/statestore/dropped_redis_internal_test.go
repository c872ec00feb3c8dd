//go:build unix

package statestore

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestRedisUnixSocketShutdownDropped: a Redis reached over a Unix socket
// removes the socket at shutdown, so that a dial finds no file
// (ENOENT), not a refusal. Every exchange after the one that met its
// connections closed must still be marked ErrDropped, under a short
// bound (go-redis dials five times, 100 ms apart: the deadline comes
// first) and a long one (the dial's own error, or the pool's last one
// once it stops dialing): the store went down, and may come back empty.
func TestRedisUnixSocketShutdownDropped(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	dial := func() (net.Conn, error) { return net.DialTimeout("unix", sock, time.Second) }
	p := proxytest.StartRedisWith(t, dial, "--port", "0", "--unixsocket", sock)
	r := openRedis(t, "unix://"+sock)
	o := Owner{Replica: "a", Boot: "b"}
	ctx := context.Background()
	if err := r.Heartbeat(ctx, o, time.Minute); err != nil {
		t.Fatal(err)
	}
	proxytest.RedisCommand(dial, "SHUTDOWN NOSAVE", "") // no answer: the server closes it
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("redis-server still running after SHUTDOWN")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket outlived the server: %v", err)
	}
	// Past eight failed dials (PoolSize) the pool answers its last dial
	// error without dialing: marked still.
	bounds := []time.Duration{time.Second, 300 * time.Millisecond, 300 * time.Millisecond}
	for range 10 {
		bounds = append(bounds, 5*time.Second)
	}
	for _, bound := range bounds {
		bctx, cancel := context.WithTimeout(ctx, bound)
		err := r.Heartbeat(bctx, o, time.Minute)
		cancel()
		if !errors.Is(err, ErrDropped) {
			t.Errorf("bound %v: %v: not marked ErrDropped", bound, err)
		}
	}
}

// TestRedisTLSDropsCounted: over TLS (rediss://) the store's dialer
// wraps the TLS connection, which the client does not check before use
// (it cannot peek under TLS): a connection the server closed is counted
// when read, so that an exchange failing after the server's end closed
// its connections, then went silent (a host shutting down), is
// ErrDropped, and one over a link gone silent alone is not.
func TestRedisTLSDropsCounted(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeSelfSigned(t, cert, key)
	addr := proxytest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	proxytest.StartRedisWith(t, func() (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	}, "--port", "0", "--tls-port", port, "--bind", "127.0.0.1",
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert, "--tls-auth-clients", "no")
	for _, c := range []struct {
		name    string
		fault   func(*proxytest.Relay)
		dropped bool
	}{
		{"closed, then silent", func(rl *proxytest.Relay) { rl.SetMode(proxytest.RelaySilent); rl.CloseAll() }, true},
		{"silent", func(rl *proxytest.Relay) { rl.SetMode(proxytest.RelaySilent) }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rl := proxytest.StartRelay(t, addr)
			r := openRedis(t, "rediss://"+rl.Addr()+"/0?skip_verify=true")
			o := Owner{Replica: "a", Boot: "b"}
			if err := r.Heartbeat(context.Background(), o, time.Minute); err != nil {
				t.Fatal(err)
			}
			c.fault(rl)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			err := r.Heartbeat(ctx, o, time.Minute)
			if err == nil {
				t.Fatal("answered")
			}
			if errors.Is(err, ErrDropped) != c.dropped {
				t.Errorf("%v: ErrDropped %v, want %v", err, !c.dropped, c.dropped)
			}
		})
	}
}

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 and its
// key, PEM-encoded.
func writeSelfSigned(t *testing.T, certPath, keyPath string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
}
