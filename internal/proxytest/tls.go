package proxytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority made for a test: it issues servers'
// certificates ([CA.Issue]), which a client trusts through Pool.
type CA struct {
	// File is the CA's certificate, PEM-encoded (a server's
	// tls-ca-cert-file).
	File string
	// Pool holds the CA's certificate alone (a client's RootCAs).
	Pool *x509.CertPool

	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial atomic.Int64
}

// NewCA makes a CA valid for an hour either side of now, and writes its
// certificate in a folder of the test's.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "proxytest CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{File: filepath.Join(t.TempDir(), "ca.pem"), Pool: x509.NewCertPool(), cert: cert, key: key}
	ca.Pool.AddCert(cert)
	ca.serial.Store(1)
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue writes a certificate signed by ca for names alone, each an IP
// address (an IP SAN) or a host name (a DNS SAN), good for a server and
// a client, and its key, in a folder of the test's, and returns their
// paths.
func (ca *CA) Issue(t testing.TB, names ...string) (cert, key string) {
	t.Helper()
	k := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &k.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writePEM(t, cert, "CERTIFICATE", der)
	writePEM(t, key, "EC PRIVATE KEY", kb)
	return cert, key
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// ServerTLS is a Redis's or a Sentinel's TLS: its certificate and key
// (from [CA.Issue]) and the CA it trusts, which checks the servers it
// connects to (a replica's primary, a Sentinel's Redis). It asks its
// clients for a certificate from CA only with AuthClients.
type ServerTLS struct {
	CA        *CA
	Cert, Key string
	// AuthClients is Redis's default, tls-auth-clients yes: a client
	// without a certificate from CA is refused. The server presents
	// Cert to the servers it connects to, as does Dial.
	AuthClients bool
}

func (s *ServerTLS) authClients() string {
	if s.AuthClients {
		return "yes"
	}
	return "no"
}

// RedisArgs are redis-server's arguments for a Redis listening over TLS
// alone at addr (127.0.0.1:PORT), which replicates over TLS too.
func (s *ServerTLS) RedisArgs(addr string) []string {
	host, port, _ := net.SplitHostPort(addr)
	return []string{"--port", "0", "--tls-port", port, "--bind", host,
		"--tls-cert-file", s.Cert, "--tls-key-file", s.Key, "--tls-ca-cert-file", s.CA.File,
		"--tls-auth-clients", s.authClients(), "--tls-replication", "yes"}
}

// Dial dials addr over TLS for a test's own commands (readiness, a
// Sentinel's answers): the server's certificate is not checked, as a
// test may give it one that names another address. It presents Cert, for
// a server that asks for a client's (AuthClients).
func (s *ServerTLS) Dial(addr string) func() (net.Conn, error) {
	return func() (net.Conn, error) {
		pair, err := tls.LoadX509KeyPair(s.Cert, s.Key)
		if err != nil {
			return nil, err
		}
		return tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr,
			&tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{pair}})
	}
}

// StartRedisTLS starts redis-server on a free loopback port, listening
// over TLS alone with s, empty and with nothing saved to disk, and
// returns its address once it answers PING.
func StartRedisTLS(t testing.TB, s *ServerTLS) (addr string, p *Process) {
	t.Helper()
	addr = FreeAddr(t)
	return addr, StartRedisWith(t, s.Dial(addr), s.RedisArgs(addr)...)
}
