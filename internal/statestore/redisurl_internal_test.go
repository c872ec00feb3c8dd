package statestore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestParseRedisURL: the store's own parameters (wait_replicas,
// wait_timeout, tls_ca_file, tls_cert_file, tls_key_file) are taken out
// before go-redis reads the URL, a URL with master_name is Sentinel's,
// and a bad or unknown parameter is refused with an error that names it,
// never the URL's password; a TLS file missing or bad is refused with an
// error that names it and says what is wrong.
func TestParseRedisURL(t *testing.T) {
	// The files the URLs below name, as DIR/NAME.
	ca := proxytest.NewCA(t)
	cert, key := ca.Issue(t, "client")
	otherCert, _ := ca.Issue(t, "other")
	dir := t.TempDir()
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for name, from := range map[string]string{"ca.pem": ca.File, "cert.pem": cert, "key.pem": key, "other.pem": otherCert} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		write(name, b)
	}
	write("text.pem", []byte("not PEM\n"))
	write("garbled.pem", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	if err := os.WriteFile(filepath.Join(dir, "big.pem"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "big.pem"), maxTLSFile+1); err != nil {
		t.Fatal(err)
	}
	const (
		mtls    = "tls_cert_file=DIR/cert.pem&tls_key_file=DIR/key.pem"
		caFile  = "tls_ca_file=DIR/ca.pem"
		refused = `tls_ca_file="DIR/`
	)
	for _, c := range []struct {
		url     string
		err     string // "" for none
		master  string // failover's master name
		addrs   int    // failover's Sentinels
		wait    int
		timeout time.Duration
		ca      bool // RootCAs from tls_ca_file
		cert    bool // a client certificate
	}{
		{url: "redis://127.0.0.1:6379/0"},
		{url: "rediss://u:p@h:6379/2?wait_replicas=2", wait: 2, timeout: DefaultWaitTimeout},
		{url: "redis://h:6379/0?wait_replicas=1&wait_timeout=250ms", wait: 1, timeout: 250 * time.Millisecond},
		{url: "redis://s1:26379/0?master_name=wt", master: "wt", addrs: 1},
		{url: "redis://s1:26379/0?master_name=wt&addr=s2:26379&addr=s3:26379&wait_replicas=1&password=x", master: "wt", addrs: 3, wait: 1, timeout: DefaultWaitTimeout},
		{url: "redis://h:6379/0?wait_replicas=0", err: `wait_replicas="0"`},
		{url: "redis://h:6379/0?wait_replicas=two", err: `wait_replicas="two"`},
		{url: "redis://h:6379/0?wait_replicas=1&wait_replicas=2", err: "wait_replicas"},
		{url: "redis://h:6379/0?wait_timeout=1s", err: "wait_timeout without wait_replicas"},
		{url: "redis://h:6379/0?wait_replicas=1&wait_timeout=soon", err: `wait_timeout="soon"`},
		{url: "redis://h:6379/0?wait_replicas=1&wait_timeout=0s", err: `wait_timeout="0s"`},
		{url: "redis://h:6379/0?wait_replica=1", err: "unexpected option: wait_replica"},
		{url: "redis://s1:26379/0?master_name=wt&bogus=1", err: "unexpected option: bogus"},
		{url: "redis://s1:26379/0?master_name=", err: "master_name is empty"},
		{url: "redis://s1:26379/0?master_name=wt&addr=nowhere", err: "addr param: nowhere"},
		{url: "redis://u:secret@h:port/0", err: "invalid port"},
		{url: "http://h:6379/0", err: `scheme "http"`},
		{url: "unix:///tmp/r.sock?db=0&wait_replicas=1", wait: 1, timeout: DefaultWaitTimeout},
		{url: "unix:///tmp/r.sock?master_name=wt", err: "Unix socket"},
		// A pair url.Query drops (a ';', a '%' without two hex digits)
		// would take the password with it, unseen, and leave it in the
		// URL the server logs (its redaction reads the same query).
		{url: "redis://s1:26379/0?master_name=wt&password=sec;ret", err: "query"},
		{url: "redis://h:6379/0?wait_replicas=1&password=sec%zzret", err: "query"},

		{url: "rediss://h:6379/0?" + caFile, ca: true},
		{url: "rediss://u:p@h:6379/0?" + mtls + "&wait_replicas=1", cert: true, wait: 1, timeout: DefaultWaitTimeout},
		{url: "rediss://h:6379/0?" + caFile + "&" + mtls, ca: true, cert: true},
		{url: "rediss://h:6379/0?" + mtls + "&skip_verify=true", cert: true},
		{url: "rediss://s1:26379/0?master_name=wt&addr=s2:26379&" + caFile + "&" + mtls, master: "wt", addrs: 2, ca: true, cert: true},
		{url: "redis://h:6379/0?" + caFile, err: "tls_ca_file over redis://"},
		{url: "redis://s1:26379/0?master_name=wt&" + mtls, err: "tls_cert_file over redis://"},
		{url: "unix:///tmp/r.sock?" + mtls, err: "over unix://"},
		{url: "rediss://h:6379/0?tls_ca_file=", err: "tls_ca_file: want one path"},
		{url: "rediss://h:6379/0?" + caFile + "&" + caFile, err: "tls_ca_file: want one path"},
		{url: "rediss://h:6379/0?tls_cert_file=DIR/cert.pem", err: "tls_cert_file and tls_key_file go together"},
		{url: "rediss://h:6379/0?tls_key_file=DIR/key.pem", err: "tls_cert_file and tls_key_file go together"},
		{url: "rediss://h:6379/0?" + caFile + "&skip_verify=true", err: "tls_ca_file with skip_verify=true"},
		{url: "rediss://u:secret@h:6379/0?tls_ca_file=DIR/none.pem", err: refused + `none.pem": no such file or directory`},
		{url: "rediss://h:6379/0?tls_ca_file=DIR", err: `tls_ca_file="DIR": not a regular file`},
		{url: "rediss://h:6379/0?tls_ca_file=DIR/text.pem", err: refused + `text.pem": no PEM certificate`},
		{url: "rediss://h:6379/0?tls_ca_file=DIR/garbled.pem", err: refused + `garbled.pem": certificate 1: x509: `},
		{url: "rediss://h:6379/0?tls_ca_file=DIR/big.pem", err: refused + `big.pem": 4194305 bytes, more than 4 MiB`},
		{url: "rediss://h:6379/0?tls_ca_file=DIR/key.pem", err: refused + `key.pem": no PEM certificate`},
		{url: "rediss://h:6379/0?tls_cert_file=DIR/none.pem&tls_key_file=DIR/key.pem", err: `tls_cert_file="DIR/none.pem": no such file`},
		{url: "rediss://h:6379/0?tls_cert_file=DIR/cert.pem&tls_key_file=DIR/none.pem", err: `tls_key_file="DIR/none.pem": no such file`},
		{url: "rediss://h:6379/0?tls_cert_file=DIR/text.pem&tls_key_file=DIR/key.pem", err: `tls_cert_file="DIR/text.pem": no PEM certificate`},
		{url: "rediss://h:6379/0?tls_cert_file=DIR/cert.pem&tls_key_file=DIR/cert.pem", err: `tls_key_file="DIR/cert.pem": no PEM private key`},
		{url: "rediss://h:6379/0?tls_cert_file=DIR/other.pem&tls_key_file=DIR/key.pem", err: `tls_cert_file="DIR/other.pem", tls_key_file="DIR/key.pem": tls: private key does not match public key`},
	} {
		c.url = strings.ReplaceAll(c.url, "DIR", dir)
		c.err = strings.ReplaceAll(c.err, "DIR", dir)
		cfg, err := parseRedisURL(c.url)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one saying %q", c.url, err, c.err)
			} else if strings.Contains(err.Error(), "secret") {
				t.Errorf("%s: error %v shows the password", c.url, err)
			}
			if err := CheckURL(c.url); err == nil {
				t.Errorf("CheckURL(%s) = nil", c.url)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.url, err)
			continue
		}
		if cfg.wait != c.wait || cfg.waitTimeout != c.timeout {
			t.Errorf("%s: wait %d for %v, want %d for %v", c.url, cfg.wait, cfg.waitTimeout, c.wait, c.timeout)
		}
		switch {
		case c.master == "" && cfg.plain == nil:
			t.Errorf("%s: not a plain URL", c.url)
		case c.master != "" && (cfg.failover == nil || cfg.failover.MasterName != c.master || len(cfg.failover.SentinelAddrs) != c.addrs):
			t.Errorf("%s: failover %+v, want master %s through %d Sentinels", c.url, cfg.failover, c.master, c.addrs)
		}
		if conf := cfg.tlsConfig(); c.ca != (conf != nil && conf.RootCAs != nil) || c.cert != (conf != nil && conf.GetClientCertificate != nil) {
			t.Errorf("%s: CAs %t and client certificate %t, want %t and %t", c.url, conf != nil && conf.RootCAs != nil, conf != nil && conf.GetClientCertificate != nil, c.ca, c.cert)
		}
		if err := CheckURL(c.url); err != nil && !strings.HasPrefix(c.url, "unix:") { // Open's are redis:// and rediss://
			t.Errorf("CheckURL(%s): %v", c.url, err)
		}
	}
	for _, u := range []string{"file", "file:/x/s.db"} {
		if err := CheckURL(u); err != nil {
			t.Errorf("CheckURL(%s): %v", u, err)
		}
	}
	if err := CheckURL("mongodb://h"); err == nil || !strings.Contains(err.Error(), "unknown store") {
		t.Errorf("CheckURL(mongodb://h) = %v", err)
	}
}
