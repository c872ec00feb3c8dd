package statestore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisConfig is a Redis store's URL parsed: go-redis's options for one
// server (plain) or for a primary found through Sentinel (failover), and
// the store's own parameters, which go-redis does not know.
type redisConfig struct {
	plain    *redis.Options
	failover *redis.FailoverOptions
	// wait is wait_replicas: every exchange that writes is followed, on
	// its connection, by WAIT for that many replicas (0: none).
	wait int
	// waitTimeout is wait_timeout: WAIT's bound (DefaultWaitTimeout),
	// capped at 2/3 of what the exchange's deadline leaves (waitFor).
	waitTimeout time.Duration
	// tls is tls_ca_file, tls_cert_file and tls_key_file, read (nil:
	// none).
	tls *tlsFiles
}

// tlsParams are the store's TLS parameters: the CAs a server's
// certificate is checked against (instead of the system's), and the
// client's certificate and key.
var tlsParams = [...]string{"tls_ca_file", "tls_cert_file", "tls_key_file"}

// DefaultWaitTimeout bounds a WAIT for replicas when the URL sets
// wait_replicas and no wait_timeout.
const DefaultWaitTimeout = time.Second

// parseRedisURL parses a Redis store's URL:
//
//	redis://[user:pass@]HOST:PORT/DB[?wait_replicas=N[&wait_timeout=D]]
//	redis://[user:pass@]SENTINEL:PORT/DB?master_name=NAME[&addr=SENTINEL2:PORT...][&wait_replicas=N...]
//	unix://[user:pass@]PATH?db=DB[&wait_replicas=N...]  (NewRedis's, for tests; Open takes redis:// and rediss://)
//
// (rediss:// for TLS, with tls_ca_file=PATH, tls_cert_file=PATH and
// tls_key_file=PATH, read here: see tlsFiles). With master_name the hosts
// are Sentinels, as go-redis's ParseFailoverURL reads them (the userinfo
// is the Sentinels'; the primary's are the password= and username=
// parameters). The parameters of go-redis's own URLs are accepted and
// then overridden where NewRedis sets them; an unknown one is refused.
// The URL is not echoed in an error: it may hold a password.
func parseRedisURL(s string) (*redisConfig, error) {
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message quotes the URL
		}
		return nil, fmt.Errorf("statestore: redis URL: %v", err)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" && u.Scheme != "unix" {
		return nil, fmt.Errorf("statestore: redis URL: scheme %q: want redis or rediss", u.Scheme)
	}
	// Not u.Query, which drops a pair it cannot read, unseen: a
	// password= among them, which the server then logged in clear.
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, errors.New("statestore: redis URL: its query does not parse (a ';', or a '%' not followed by two hex digits): escape its values")
	}
	cfg := &redisConfig{}
	if q.Has("wait_replicas") {
		n, err := strconv.Atoi(q.Get("wait_replicas"))
		if err != nil || n < 1 || len(q["wait_replicas"]) > 1 {
			return nil, fmt.Errorf("statestore: redis URL: wait_replicas=%q: want one whole number of replicas, 1 or more", q.Get("wait_replicas"))
		}
		cfg.wait = n
		cfg.waitTimeout = DefaultWaitTimeout
	}
	if q.Has("wait_timeout") {
		d, err := time.ParseDuration(q.Get("wait_timeout"))
		switch {
		case cfg.wait == 0:
			return nil, errors.New("statestore: redis URL: wait_timeout without wait_replicas")
		case err != nil || d < time.Millisecond || len(q["wait_timeout"]) > 1:
			return nil, fmt.Errorf("statestore: redis URL: wait_timeout=%q: want one duration of 1ms or more, such as 500ms", q.Get("wait_timeout"))
		}
		cfg.waitTimeout = d
	}
	var files [len(tlsParams)]string
	for i, p := range tlsParams {
		switch {
		case !q.Has(p):
			continue
		case len(q[p]) > 1 || q.Get(p) == "":
			return nil, fmt.Errorf("statestore: redis URL: %s: want one path", p)
		case u.Scheme != "rediss":
			return nil, fmt.Errorf("statestore: redis URL: %s over %s://: TLS is rediss://", p, u.Scheme)
		}
		files[i] = q.Get(p)
		q.Del(p)
	}
	if (files[1] == "") != (files[2] == "") {
		return nil, errors.New("statestore: redis URL: tls_cert_file and tls_key_file go together: the client's certificate and its key")
	}
	q.Del("wait_replicas")
	q.Del("wait_timeout")
	u.RawQuery = q.Encode()
	if q.Has("master_name") {
		switch {
		case q.Get("master_name") == "":
			return nil, errors.New("statestore: redis URL: master_name is empty")
		case u.Scheme == "unix":
			return nil, errors.New("statestore: redis URL: master_name over a Unix socket: Sentinels are reached over TCP")
		}
		cfg.failover, err = redis.ParseFailoverURL(u.String())
	} else {
		cfg.plain, err = redis.ParseURL(u.String())
	}
	if err != nil {
		return nil, fmt.Errorf("statestore: redis URL: %v", err)
	}
	if files != [len(tlsParams)]string{} {
		conf := cfg.tlsConfig()
		if conf.InsecureSkipVerify && files[0] != "" {
			return nil, errors.New("statestore: redis URL: tls_ca_file with skip_verify=true: no certificate would be checked against it")
		}
		// Read now: a file missing or bad is refused at start.
		if cfg.tls, err = loadTLSFiles(files[0], files[1], files[2]); err != nil {
			return nil, fmt.Errorf("statestore: redis URL: %v", err)
		}
		cfg.tls.apply(conf)
	}
	return cfg, nil
}

// tlsConfig is go-redis's TLS configuration for the URL (nil for
// redis://).
func (c *redisConfig) tlsConfig() *tls.Config {
	if c.failover != nil {
		return c.failover.TLSConfig
	}
	return c.plain.TLSConfig
}

// CheckURL reports whether url names a store [Open] knows, and is well
// formed: a Redis URL's parameters are checked, and the TLS files it
// names read, without connecting.
func CheckURL(url string) error {
	switch {
	case isRedisURL(url):
		_, err := parseRedisURL(url)
		return err
	case url == "file" || strings.HasPrefix(url, "file:"):
		return nil
	}
	return unknownStore(url)
}
