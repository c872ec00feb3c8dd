package statestore

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// IDLabel names record id in errors (which the host logs): a stateful
// session's ID ("s.ID") and a handle's ("h.ID") are credentials, so they
// are named by the digests the host's logs give them ("session-" and
// 8 bytes of SHA-256, "handle-" and 6); other IDs are digests already.
func IDLabel(id string) string {
	switch {
	case strings.HasPrefix(id, "s."):
		sum := sha256.Sum256([]byte(id[2:]))
		return "session-" + hex.EncodeToString(sum[:8])
	case strings.HasPrefix(id, "h."):
		sum := sha256.Sum256([]byte(id[2:]))
		return "handle-" + hex.EncodeToString(sum[:6])
	}
	return id
}
