package statestore

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// maxTLSFile bounds what is read of a file a Redis URL names (tls_ca_file,
// tls_cert_file, tls_key_file): a system's whole CA bundle is about
// 200 KiB.
const maxTLSFile = 4 << 20

// tlsLog is where a TLS file found bad at rotation, or picked up, is
// logged (LogRedis's logger; slog's default until it is called).
var tlsLog atomic.Pointer[slog.Logger]

func tlsLogger() *slog.Logger {
	if l := tlsLog.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// tlsFiles are the TLS files a Redis URL names, read again when they
// change on disk, so that a rotated CA or client certificate is used
// from the next connection dialed, without a restart: the CAs when a
// connection is dialed (tlsPerHost), the key pair when a server asks for
// it (GetClientCertificate).
type tlsFiles struct {
	roots *reloaded[*x509.CertPool]   // tls_ca_file's (nil: none)
	pair  *reloaded[*tls.Certificate] // tls_cert_file's and tls_key_file's (nil: none)
}

// loadTLSFiles reads the files first, at start: an error names the
// parameter, the file, and what is wrong. An empty path is a file not
// named (cert and key both or neither).
func loadTLSFiles(ca, cert, key string) (*tlsFiles, error) {
	f := &tlsFiles{}
	var err error
	if ca != "" {
		f.roots, err = newReloaded("CA file", []string{"tls_ca_file"}, []string{ca},
			func() (*x509.CertPool, []fileStamp, error) { return readRoots(ca) })
		if err != nil {
			return nil, err
		}
	}
	if cert != "" {
		f.pair, err = newReloaded("client certificate", []string{"tls_cert_file", "tls_key_file"}, []string{cert, key},
			func() (*tls.Certificate, []fileStamp, error) { return readPair(cert, key) })
		if err != nil {
			return nil, err
		}
	}
	return f, nil
}

// apply sets conf to use f: the CAs as read at start (tlsPerHost reads
// them again per dial: rootsNow), the key pair when a server asks for
// one.
func (f *tlsFiles) apply(conf *tls.Config) {
	if f.roots != nil {
		conf.RootCAs = f.roots.v
	}
	if f.pair != nil {
		conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return f.pair.now(), nil }
	}
}

// rootsNow is the CAs tls_ca_file holds now, or the last good ones;
// nil without tls_ca_file.
func (f *tlsFiles) rootsNow() *x509.CertPool {
	if f == nil || f.roots == nil {
		return nil
	}
	return f.roots.now()
}

// reloaded is a value read from files, read again when one of them
// changed: its modification time or size (os.Stat, which follows
// symbolic links, so a Kubernetes secret's swap is seen). Files found bad
// then (missing, not PEM, a key not matching the certificate: a rotation
// half done) are logged once and the last good value kept; the next
// change is read again.
type reloaded[T any] struct {
	what          string   // for the log
	params, paths []string // the URL's parameters, and their files
	read          func() (T, []fileStamp, error)

	mu     sync.Mutex
	v      T
	stamps []fileStamp // v's files'
	// bad are the stamps of the files last found bad, so that they are
	// neither read nor logged again until they change.
	bad []fileStamp
}

// fileStamp is what tells a file changed: its modification time and size.
type fileStamp struct{ mod, size int64 }

func stampOf(fi fs.FileInfo) fileStamp { return fileStamp{fi.ModTime().UnixNano(), fi.Size()} }

func newReloaded[T any](what string, params, paths []string, read func() (T, []fileStamp, error)) (*reloaded[T], error) {
	v, st, err := read()
	if err != nil {
		return nil, err
	}
	return &reloaded[T]{what: what, params: params, paths: paths, read: read, v: v, stamps: st}, nil
}

// now is the value the files hold now, or the last good one.
func (r *reloaded[T]) now() T {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := make([]fileStamp, len(r.paths))
	var gone error
	for i, p := range r.paths {
		fi, err := os.Stat(p)
		if err != nil {
			// A file gone (a rotation's rename) is bad until it
			// is back.
			st[i] = fileStamp{-1, -1}
			gone = cmp.Or(gone, tlsFileErr(r.params[i], p, err))
			continue
		}
		st[i] = stampOf(fi)
	}
	if slices.Equal(st, r.stamps) || slices.Equal(st, r.bad) {
		return r.v
	}
	if gone != nil {
		return r.failed(st, gone)
	}
	v, read, err := r.read()
	if err != nil {
		return r.failed(st, err)
	}
	// The stamps as read: a file changed since its Stat is read again.
	r.v, r.stamps, r.bad = v, read, nil
	tlsLogger().Info("the Redis store's "+r.what+" changed: read again", r.params[0], r.paths[0])
	return r.v
}

// failed logs err, the files being as st says, and keeps the last good
// value: the files are not read again until they change.
func (r *reloaded[T]) failed(st []fileStamp, err error) T {
	r.bad = st
	tlsLogger().Warn("the Redis store's "+r.what+" is bad: the one read before is kept", "error", err)
	return r.v
}

// readRoots reads the PEM certificates in the CA file at path: at least
// one, each of them well formed.
func readRoots(path string) (*x509.CertPool, []fileStamp, error) {
	b, st0, err := readTLSFile("tls_ca_file", path)
	st := []fileStamp{st0}
	if err != nil {
		return nil, st, err
	}
	roots := x509.NewCertPool()
	n := 0
	for {
		var block *pem.Block
		if block, b = pem.Decode(b); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, st, fmt.Errorf("tls_ca_file=%q: certificate %d: %v", path, n+1, err)
		}
		roots.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, st, fmt.Errorf("tls_ca_file=%q: no PEM certificate (-----BEGIN CERTIFICATE-----) in it", path)
	}
	return roots, st, nil
}

// readPair reads a client's key pair: the certificate (its chain after
// it) and the private key, PEM-encoded, which must match.
func readPair(certPath, keyPath string) (*tls.Certificate, []fileStamp, error) {
	st := make([]fileStamp, 2)
	c, cst, err := readTLSFile("tls_cert_file", certPath)
	st[0] = cst
	if err != nil {
		return nil, st, err
	}
	k, kst, err := readTLSFile("tls_key_file", keyPath)
	st[1] = kst
	if err != nil {
		return nil, st, err
	}
	if !hasPEM(c, func(t string) bool { return t == "CERTIFICATE" }) {
		return nil, st, fmt.Errorf("tls_cert_file=%q: no PEM certificate (-----BEGIN CERTIFICATE-----) in it", certPath)
	}
	if !hasPEM(k, func(t string) bool { return strings.HasSuffix(t, "PRIVATE KEY") }) {
		return nil, st, fmt.Errorf("tls_key_file=%q: no PEM private key (-----BEGIN PRIVATE KEY-----, or EC or RSA) in it", keyPath)
	}
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		return nil, st, fmt.Errorf("tls_cert_file=%q, tls_key_file=%q: %v", certPath, keyPath, err)
	}
	return &pair, st, nil
}

func hasPEM(b []byte, typ func(string) bool) bool {
	for {
		var block *pem.Block
		if block, b = pem.Decode(b); block == nil {
			return false
		}
		if typ(block.Type) {
			return true
		}
	}
}

// readTLSFile reads the file at path, a regular file (not a pipe, which
// would hold a dial) of maxTLSFile bytes at most, and its stamp as read.
func readTLSFile(param, path string) ([]byte, fileStamp, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fileStamp{}, tlsFileErr(param, path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileStamp{}, tlsFileErr(param, path, err)
	}
	st := stampOf(fi)
	switch {
	case !fi.Mode().IsRegular():
		return nil, st, fmt.Errorf("%s=%q: not a regular file", param, path)
	case fi.Size() > maxTLSFile:
		return nil, st, fmt.Errorf("%s=%q: %d bytes, more than %d MiB", param, path, fi.Size(), maxTLSFile>>20)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTLSFile+1))
	switch {
	case err != nil:
		return nil, st, tlsFileErr(param, path, err)
	case len(b) > maxTLSFile: // grown since its Stat
		return nil, st, fmt.Errorf("%s=%q: more than %d MiB", param, path, maxTLSFile>>20)
	}
	return b, st, nil
}

// tlsFileErr is err about the file at path, named once (an os.PathError
// names it too).
func tlsFileErr(param, path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("%s=%q: %v", param, path, err)
}
