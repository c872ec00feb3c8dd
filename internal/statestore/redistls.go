package statestore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"time"
)

// dialFunc is go-redis's dialer.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// tlsPerHost is dial with TLS over it, conf's settings for each server but
// its name: a server's certificate is checked against the host dialed.
// go-redis's failover client dials the Sentinels and the Redis servers
// with one TLS configuration, whose ServerName is the URL's first host,
// so every certificate had to carry that name, though a Redis is dialed
// at the address Sentinel gives (its IP, unless hostnames are announced)
// and a Sentinel at its own. A certificate that carries conf's name is
// still accepted, as it was: a deployment whose certificates share that
// name goes on working (no weaker: the Sentinels, which have such a
// certificate, name the primary anyway). timeout bounds the dial and the
// handshake together, as tls.DialWithDialer's did. The CAs trusted are
// files' as they are at each dial (tls_ca_file), else conf's.
func tlsPerHost(dial dialFunc, conf *tls.Config, files *tlsFiles, timeout time.Duration) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		conf := conf // this dial's
		if roots := files.rootsNow(); roots != nil {
			conf = conf.Clone()
			conf.RootCAs = roots
		}
		c := conf.Clone()
		c.ServerName = host
		if !conf.InsecureSkipVerify && conf.ServerName != "" && conf.ServerName != host {
			// Verified by verifyEither instead: the standard check
			// takes one name.
			c.InsecureSkipVerify = true
			c.VerifyConnection = func(cs tls.ConnectionState) error { return verifyEither(cs, conf, host) }
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(raw, c)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return tc, nil
	}
}

// verifyEither checks the server's certificate chain as crypto/tls does
// (conf's roots and clock), for host, or else for conf.ServerName. The
// error is host's.
func verifyEither(cs tls.ConnectionState, conf *tls.Config, host string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the server gave no certificate")
	}
	opts := x509.VerifyOptions{Roots: conf.RootCAs, Intermediates: x509.NewCertPool(), DNSName: host}
	if conf.Time != nil {
		opts.CurrentTime = conf.Time()
	}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	leaf := cs.PeerCertificates[0]
	_, err := leaf.Verify(opts)
	if errors.As(err, new(x509.HostnameError)) {
		opts.DNSName = conf.ServerName
		if _, other := leaf.Verify(opts); other == nil {
			return nil
		}
	}
	if err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	return nil
}
