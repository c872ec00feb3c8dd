package statestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// ErrKeyMismatch: the store's values were sealed with another state key
// than this process's: its replicas do not share WASMTOOLS_STATE_KEY, and
// sessions moving between them would be lost.
var ErrKeyMismatch = errors.New("statestore: the store's values are sealed with another state key")

// checkID and checkField hold the store's key check: a value sealed by
// the first process that found none (in the store's current epoch: a
// store that came back empty gets a new one).
const (
	checkID    = "wt-keycheck"
	checkField = "check"
	checkValue = "wasmtools state key check v1"
)

// CheckKey tells whether s (as [Open] returns it: sealed) opens the values
// other processes sealed in it: it reads the store's check value, writing
// it first if the store has none. It fails with [ErrKeyMismatch] when the
// value does not open, or with the store's error when it cannot tell.
func CheckKey(ctx context.Context, s Store) error {
	rec, err := s.Get(ctx, checkID)
	switch {
	case errors.Is(err, ErrSeal):
		return ErrKeyMismatch
	case err == nil && string(rec[checkField]) == checkValue:
		return nil
	case err == nil:
		return ErrKeyMismatch
	case !errors.Is(err, ErrNotFound):
		return err
	}
	ctx = uncounted(ctx) // the operator's record, no tenant's
	owner := Owner{Replica: "keycheck", Boot: "-"}
	c, err := s.Claim(ctx, checkID, owner, 365*24*time.Hour, true)
	if err != nil {
		return err
	}
	if err := s.Put(ctx, checkID, checkField, []byte(checkValue), c.Fence, 365*24*time.Hour); err != nil && !errors.Is(err, ErrFenced) {
		return err
	}
	// Read back: another process may have written its own meanwhile.
	rec, err = s.Get(ctx, checkID)
	switch {
	case errors.Is(err, ErrSeal):
		return ErrKeyMismatch
	case err != nil:
		return err
	case string(rec[checkField]) != checkValue:
		return ErrKeyMismatch
	}
	return nil
}

// KeyFile reads the state key at path, making one first if there is none
// (64 hex digits, mode 0600). A key is made whole or not at all: written
// to a temporary file, synced, and linked into place (so a process killed
// meanwhile leaves no half key, and of two processes making one at once,
// both use the first linked); the directory is synced too.
func KeyFile(path string) ([]byte, error) {
	if b, err := os.ReadFile(path); err == nil {
		if len(b) < 32 {
			return nil, fmt.Errorf("state key %s is too short", path)
		}
		return b, nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	k := make([]byte, 32)
	rand.Read(k)
	key := []byte(hex.EncodeToString(k))
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, err
	}
	if _, err := tmp.Write(key); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return KeyFile(path) // made meanwhile by another process
		}
		return nil, err
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return key, nil
}
