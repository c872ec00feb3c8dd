package host

import (
	"context"
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
// token as a bearer token, compared in constant time. Requests that do
// carry it get the subject "operator", so sessionless (2026-07-28)
// requests share instances by it (see [Options.ClientKeyHeader]).
func RequireToken(token string, next http.Handler) http.Handler {
	verify := func(_ context.Context, got string, _ *http.Request) (*auth.TokenInfo, error) {
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: "operator", Expiration: time.Now().Add(24 * time.Hour)}, nil
	}
	return auth.RequireBearerToken(verify, nil)(next)
}
