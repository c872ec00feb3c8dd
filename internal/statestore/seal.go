package statestore

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"
)

// SealOverhead is what sealing adds to a value: a version byte, the
// 12-byte nonce and the 16-byte GCM tag. A value is refused with
// [ErrTooLarge] when its sealed form would exceed [MaxValue].
const SealOverhead = 1 + 12 + 16

const sealVersion = 1

// ErrSeal matches a [*SealError].
var ErrSeal = errors.New("statestore: sealed value does not open")

// SealError is a stored value that does not open: it was changed, moved
// to another session or field, or sealed with another state key. A caller
// treats the session's state as lost.
type SealError struct{ ID, Field string }

func (e *SealError) Error() string {
	return fmt.Sprintf("statestore: session %s field %s: sealed value does not open (changed, moved, or sealed with another state key)", e.ID, e.Field)
}
func (e *SealError) Is(target error) bool { return target == ErrSeal }

// Seal returns s with every value sealed: AES-256-GCM under a key derived
// from stateKey (HKDF-SHA256, info "wasmtools statestore v1"), a random
// nonce per value, and the record's ID and field as additional data, so a
// value opens only where it was written. Get fails with a *SealError for
// a value that does not open. Names, fences and owners are not sealed.
// Closing the result closes s. stateKey must not be empty (Seal panics:
// [Open] checks it first).
func Seal(s Store, stateKey []byte) Store {
	if len(stateKey) == 0 {
		panic("statestore: Seal with an empty state key")
	}
	key, err := hkdf.Key(sha256.New, stateKey, nil, "wasmtools statestore v1", 32)
	if err != nil {
		panic(err) // only for a key length HKDF cannot give
	}
	block, _ := aes.NewCipher(key) // 32 bytes: AES-256
	aead, _ := cipher.NewGCM(block)
	return &sealed{Store: s, aead: aead}
}

type sealed struct {
	Store
	aead cipher.AEAD
}

func sealAD(id, field string) []byte { return []byte(id + "\x00" + field) }

func (s *sealed) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	if len(value) > MaxValue-SealOverhead {
		return ErrTooLarge
	}
	out := make([]byte, 1+12, 1+12+len(value)+16)
	out[0] = sealVersion
	rand.Read(out[1:13])
	out = s.aead.Seal(out, out[1:13], value, sealAD(id, field))
	return s.Store.Put(ctx, id, field, out, fence, ttl)
}

func (s *sealed) Get(ctx context.Context, id string) (map[string][]byte, error) {
	fields, err := s.Store.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	for field, v := range fields {
		if len(v) < SealOverhead || v[0] != sealVersion {
			return nil, &SealError{ID: id, Field: field}
		}
		plain, err := s.aead.Open(v[13:13], v[1:13], v[13:], sealAD(id, field))
		if err != nil {
			return nil, &SealError{ID: id, Field: field}
		}
		fields[field] = plain
	}
	return fields, nil
}
