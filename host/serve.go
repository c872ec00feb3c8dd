package host

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"io"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ServeStdio serves one MCP session over r and w (the process's stdin and
// stdout, for `wasmtools serve`) until the client closes r or ctx ends.
// Neither r nor w is closed.
func (h *Host) ServeStdio(ctx context.Context, r io.Reader, w io.Writer) error {
	return h.server.Run(ctx, &mcp.IOTransport{Reader: io.NopCloser(r), Writer: nopWriteCloser{w}})
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// RequireToken wraps an HTTP handler so that every request must carry
// token as a bearer token. It is [RequireTokens] with one shared token.
func RequireToken(token string, next http.Handler) http.Handler {
	return RequireTokens(token, nil, next)
}

// RequireTokens wraps an HTTP handler so that every request must carry a
// bearer token: shared (if not "") or one of subjects' (subject name to
// token). Tokens are compared by their SHA-256 digests, in constant time
// for the shared one.
//
// A subject's token identifies its bearer: its requests carry the subject
// as auth.TokenInfo.UserID, to which session handles are bound and
// stateful HTTP sessions tied. The shared token identifies no one (every
// client of the server may hold it), so its requests have no subject and
// clients tell their state apart by session or handle alone.
func RequireTokens(shared string, subjects map[string]string, next http.Handler) http.Handler {
	var sharedSum [32]byte
	if shared != "" {
		sharedSum = sha256.Sum256([]byte(shared))
	}
	bySum := make(map[[32]byte]string, len(subjects))
	for subject, token := range subjects {
		// A subject's token that is also the shared one identifies no
		// one: every holder of the shared token would be the subject.
		if sum := sha256.Sum256([]byte(token)); token != "" && subject != "" && (shared == "" || sum != sharedSum) {
			bySum[sum] = subject
		}
	}
	verify := func(_ context.Context, got string, _ *http.Request) (*auth.TokenInfo, error) {
		sum := sha256.Sum256([]byte(got))
		expires := time.Now().Add(24 * time.Hour)
		if subject, ok := bySum[sum]; ok {
			return &auth.TokenInfo{UserID: subject, Expiration: expires}, nil
		}
		if shared != "" && subtle.ConstantTimeCompare(sum[:], sharedSum[:]) == 1 {
			return &auth.TokenInfo{Expiration: expires}, nil
		}
		return nil, auth.ErrInvalidToken
	}
	return auth.RequireBearerToken(verify, nil)(next)
}
