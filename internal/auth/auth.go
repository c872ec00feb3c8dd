// Package auth says who an HTTP request is from and what it may do: the
// tenants' identities (static bearer tokens, or OAuth 2.1 access tokens
// checked as a resource server per the MCP authorization specification)
// and the operator's authority over /drain, /reload, /status and
// /metrics.
//
// It imports neither the MCP SDK nor net/http's server side: host turns
// an [Identity] into the SDK's token info, cmd/wasmtools wires the
// operator's gate into its mux.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"slices"
	"strings"
	"time"
)

// ErrInvalidToken is the error (matched with errors.Is) of a token that
// is not valid: unknown, malformed, expired, not yet valid, for another
// audience or issuer, or wrongly signed. Its text says which, and is safe
// to show the client.
var ErrInvalidToken = errors.New("invalid token")

// Identity is who a verified bearer token speaks for.
type Identity struct {
	// Subject names the tenant: a subject of the static token table, or
	// an access token's issuer and sub joined by a space. "" is no one in
	// particular (the shared token): its clients are told apart by
	// session or handle alone and share the anonymous pool.
	Subject string
	// Scopes are the token's OAuth scopes.
	Scopes []string
	// Expires is when the token stops being valid.
	Expires time.Time
	// Claims are an access token's claims (nil for a static token), for
	// per-plugin access rules.
	Claims map[string]any
}

// HasScope reports whether id holds scope.
func (id Identity) HasScope(scope string) bool { return slices.Contains(id.Scopes, scope) }

// A Verifier checks a bearer token. It fails with an error matching
// [ErrInvalidToken] for a token that is not valid, and with another error
// when it cannot tell now (the authorization server is unreachable).
// Verifiers are safe for concurrent use.
type Verifier interface {
	Verify(ctx context.Context, token string) (Identity, error)
}

// staticLifetime is the expiry a static token's identity is given: the
// SDK's middleware wants one, and a static token lasts until the
// configuration changes.
const staticLifetime = 24 * time.Hour

// Static is a [Verifier] of static bearer tokens: one shared token, which
// identifies no one, and tokens of named subjects. Tokens are compared by
// their SHA-256 digests, the shared one in constant time.
type Static struct {
	shared   [32]byte
	hasShare bool
	subjects map[[32]byte]string
}

// NewStatic makes a [Static] verifier of the shared token (if not "") and
// the subjects' tokens (subject name to token). A subject's token that is
// also the shared one identifies no one and is left out.
func NewStatic(shared string, subjects map[string]string) *Static {
	s := &Static{subjects: make(map[[32]byte]string, len(subjects))}
	if shared != "" {
		s.shared, s.hasShare = sha256.Sum256([]byte(shared)), true
	}
	for subject, token := range subjects {
		if sum := sha256.Sum256([]byte(token)); token != "" && subject != "" && (!s.hasShare || sum != s.shared) {
			s.subjects[sum] = subject
		}
	}
	return s
}

// Empty reports whether s knows no token at all.
func (s *Static) Empty() bool { return !s.hasShare && len(s.subjects) == 0 }

// Verify implements [Verifier].
func (s *Static) Verify(_ context.Context, token string) (Identity, error) {
	sum := sha256.Sum256([]byte(token))
	expires := time.Now().Add(staticLifetime)
	if subject, ok := s.subjects[sum]; ok {
		return Identity{Subject: subject, Expires: expires}, nil
	}
	if s.hasShare && subtle.ConstantTimeCompare(sum[:], s.shared[:]) == 1 {
		return Identity{Expires: expires}, nil
	}
	return Identity{}, ErrInvalidToken
}

// Chain is a [Verifier] that asks each verifier in turn and answers with
// the first that knows the token. A verifier's error other than
// [ErrInvalidToken] (cannot tell now) is returned if none knows it.
type Chain []Verifier

// Verify implements [Verifier].
func (c Chain) Verify(ctx context.Context, token string) (Identity, error) {
	var last error = ErrInvalidToken
	for _, v := range c {
		id, err := v.Verify(ctx, token)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, ErrInvalidToken) || errors.Is(last, ErrInvalidToken) {
			last = err
		}
	}
	return Identity{}, last
}

// Operator names the operator's credential: a token of its own, subjects,
// or an OAuth scope. The zero Operator names none, and then the operator
// is whoever is on the server's machine (see [Operator.Configured]).
type Operator struct {
	// Token is the operator's own bearer token, compared in constant
	// time by digest.
	Token string
	// Subjects act as the operator when their tokens verify.
	Subjects []string
	// Scope, if set, makes a verified token holding it the operator's.
	Scope string
}

// Configured reports whether o names any credential.
func (o Operator) Configured() bool {
	return o.Token != "" || len(o.Subjects) > 0 || o.Scope != ""
}

// IsToken reports whether token is the operator's own token.
func (o Operator) IsToken(token string) bool {
	if o.Token == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(token)), sha256.Sum256([]byte(o.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// Allows reports whether the verified identity id acts as the operator:
// its subject is one of o.Subjects, or it holds o.Scope. The anonymous
// identity (the shared token) never does.
func (o Operator) Allows(id Identity) bool {
	if id.Subject == "" {
		return false
	}
	return slices.Contains(o.Subjects, id.Subject) || o.Scope != "" && id.HasScope(o.Scope)
}

// BearerToken is the token of an Authorization header's "Bearer" scheme,
// or "" if it has none.
func BearerToken(header string) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// Challenge is the WWW-Authenticate header of a refusal (RFC 6750 §3,
// RFC 9728 §5.1), without the "Bearer " scheme.
type Challenge struct {
	// ResourceMetadata is the URL of the protected resource metadata.
	ResourceMetadata string
	// Error is "" (no token was sent), "invalid_token" or
	// "insufficient_scope".
	Error string
	// Description says why, for a person.
	Description string
	// Scope is the scopes needed, space-separated.
	Scope string
}

// String is the header's value: `Bearer resource_metadata="…", …`.
func (c Challenge) String() string {
	var params []string
	add := func(k, v string) {
		if v != "" {
			params = append(params, k+"="+quote(v))
		}
	}
	add("resource_metadata", c.ResourceMetadata)
	add("error", c.Error)
	add("error_description", c.Description)
	add("scope", c.Scope)
	if len(params) == 0 {
		return "Bearer"
	}
	return "Bearer " + strings.Join(params, ", ")
}

// quote is an RFC 9110 quoted-string of s; characters a quoted-string
// cannot hold (controls) are dropped.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
