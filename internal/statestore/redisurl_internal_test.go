package statestore

import (
	"strings"
	"testing"
	"time"
)

// TestParseRedisURL: the store's own parameters (wait_replicas,
// wait_timeout) are taken out before go-redis reads the URL, a URL with
// master_name is Sentinel's, and a bad or unknown parameter is refused
// with an error that names it, never the URL's password.
func TestParseRedisURL(t *testing.T) {
	for _, c := range []struct {
		url     string
		err     string // "" for none
		master  string // failover's master name
		addrs   int    // failover's Sentinels
		wait    int
		timeout time.Duration
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
	} {
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
