package statestore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Open opens the store named by url, sealed with stateKey (see [Seal]):
//
//	redis://[user:pass@]HOST:PORT/DB  a Redis server (rediss:// for TLS), see [Redis]
//	redis://SENTINEL:PORT/DB?master_name=NAME  its primary, found through Sentinel
//	    ...?wait_replicas=N               either, a write acknowledged once N replicas have it ([NewRedis])
//	    rediss://...?tls_ca_file=PATH&tls_cert_file=PATH&tls_key_file=PATH  either over TLS, with these CAs and client certificate
//	file:PATH or file://PATH          a file on this machine, see [File]
//	file                              the file at [DefaultPath]
//
// stateKey must be the same on every replica that shares the store, and
// not empty. The caller closes the store.
func Open(url string, stateKey []byte) (Store, error) {
	if len(stateKey) == 0 {
		return nil, errors.New("statestore: no state key: values are sealed with it")
	}
	var (
		s   Store
		err error
	)
	switch {
	case isRedisURL(url):
		s, err = NewRedis(url)
	case url == "file" || strings.HasPrefix(url, "file:"):
		path := strings.TrimPrefix(strings.TrimPrefix(url, "file"), ":")
		if strings.HasPrefix(path, "//") {
			path = path[2:]
		}
		if path == "" {
			if path, err = DefaultPath(); err != nil {
				return nil, err
			}
			if err = os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				return nil, fmt.Errorf("statestore: %v", err)
			}
		}
		s, err = NewFile(path)
	default:
		return nil, unknownStore(url)
	}
	if err != nil {
		return nil, err
	}
	return Seal(s, stateKey), nil
}

func isRedisURL(url string) bool {
	return strings.HasPrefix(url, "redis://") || strings.HasPrefix(url, "rediss://")
}

// unknownStore is the error of a URL naming no store Open knows: it
// names the scheme alone (a URL may hold a password).
func unknownStore(url string) error {
	scheme, _, ok := strings.Cut(url, ":")
	if !ok {
		scheme = url
	}
	return fmt.Errorf("statestore: unknown store %q: want redis://HOST:PORT/DB, file:PATH or file", scheme)
}

// DefaultPath is the file store's path when none is given:
// $XDG_STATE_HOME/wasmtools/sessions.db, else (unset, or not an absolute
// path, as the XDG spec says) ~/.local/state/wasmtools/sessions.db.
func DefaultPath() (string, error) {
	dir := os.Getenv("XDG_STATE_HOME")
	if !filepath.IsAbs(dir) {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("statestore: no default state file: %v", err)
		}
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "wasmtools", "sessions.db"), nil
}
