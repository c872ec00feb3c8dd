package host

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	wauth "github.com/wasmtools/wasmtools/internal/auth"
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
// token), checked by [wauth.Static].
//
// A subject's token identifies its bearer: its requests carry the subject
// as auth.TokenInfo.UserID, to which session handles are bound and
// stateful HTTP sessions tied. The shared token identifies no one (every
// client of the server may hold it), so its requests have no subject and
// clients tell their state apart by session or handle alone.
func RequireTokens(shared string, subjects map[string]string, next http.Handler) http.Handler {
	return RequireBearer(wauth.NewStatic(shared, subjects), BearerOptions{}, next)
}

// BearerOptions are what [RequireBearer] tells a client it refuses.
type BearerOptions struct {
	// ResourceMetadataURL is the URL of the protected resource metadata
	// (RFC 9728), sent in every challenge so that an MCP client finds
	// the authorization server.
	ResourceMetadataURL string
	// Scopes are required of every token; a valid token without one of
	// them is refused with 403 insufficient_scope.
	Scopes []string
}

// verifiedKey carries a request's verified token info from
// [RequireBearer]'s check to the SDK's middleware, which puts it where
// the MCP handler reads it.
type verifiedKey struct{}

// RequireBearer wraps an HTTP handler so that every request must carry a
// bearer token that v verifies, per the MCP authorization specification:
// no token or an invalid one is refused with 401 and
// `WWW-Authenticate: Bearer resource_metadata="…"` (with
// error="invalid_token" when one was sent), a valid token lacking a
// required scope with 403 and error="insufficient_scope" naming the
// scopes, and a token v cannot check now (its authorization server is
// unreachable) with 503. The identity's subject becomes the request's
// auth.TokenInfo.UserID.
func RequireBearer(v wauth.Verifier, o BearerOptions, next http.Handler) http.Handler {
	// The SDK's middleware stores the token info where the streamable
	// handler reads it (its key is the SDK's own); the check is ours, for
	// the challenges the specification asks for.
	inner := auth.RequireBearerToken(func(ctx context.Context, _ string, _ *http.Request) (*auth.TokenInfo, error) {
		if ti, ok := ctx.Value(verifiedKey{}).(*auth.TokenInfo); ok {
			return ti, nil
		}
		return nil, auth.ErrInvalidToken
	}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true, ClockSkew: time.Hour})(next)
	scope := strings.Join(o.Scopes, " ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuse := func(code int, c wauth.Challenge) {
			c.ResourceMetadata = o.ResourceMetadataURL
			w.Header().Set("WWW-Authenticate", c.String())
			http.Error(w, strings.TrimSpace(c.Error+": "+c.Description), code)
		}
		token := wauth.BearerToken(r.Header.Get("Authorization"))
		if token == "" {
			refuse(http.StatusUnauthorized, wauth.Challenge{Description: "no bearer token", Scope: scope})
			return
		}
		id, err := v.Verify(r.Context(), token)
		if errors.Is(err, wauth.ErrInvalidToken) {
			refuse(http.StatusUnauthorized, wauth.Challenge{Error: "invalid_token", Description: err.Error()})
			return
		}
		if err != nil {
			w.Header().Set("Retry-After", "5")
			http.Error(w, "the token cannot be checked now: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		for _, s := range o.Scopes {
			if !id.HasScope(s) {
				refuse(http.StatusForbidden, wauth.Challenge{Error: "insufficient_scope", Description: "the token lacks scope " + s, Scope: scope})
				return
			}
		}
		ti := &auth.TokenInfo{UserID: id.Subject, Scopes: id.Scopes, Expiration: id.Expires}
		if id.Claims != nil {
			ti.Extra = map[string]any{"claims": id.Claims} // for the access rules
		}
		inner.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), verifiedKey{}, ti)))
	})
}
