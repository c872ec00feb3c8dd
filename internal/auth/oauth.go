package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Defaults of [OAuthOptions].
const (
	// DefaultClockSkew is the tolerance on a token's exp, nbf and iat.
	DefaultClockSkew = 30 * time.Second
	// DefaultKeysMinRefresh is the least time between two fetches of the
	// key set for tokens signed with a key it does not hold: a client
	// sending tokens with made-up key IDs cannot make the server fetch
	// the authorization server's keys at its own rate.
	DefaultKeysMinRefresh = 10 * time.Second
	// DefaultKeysMaxAge is how long fetched keys are used before they are
	// fetched again, unasked.
	DefaultKeysMaxAge = time.Hour
	// DefaultHTTPTimeout bounds a request to the authorization server.
	DefaultHTTPTimeout = 10 * time.Second
)

// maxDocument bounds a metadata document, key set or introspection
// response read from the authorization server.
const maxDocument = 1 << 20

// signingAlgs are the JWS algorithms an access token may be signed
// with: asymmetric ones only. "none" and the HMAC algorithms are refused
// before any key is looked at, so a token "signed" with the server's
// public key as an HMAC secret, or not at all, never verifies.
var signingAlgs = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

// OAuthOptions configure an [OAuth] verifier. Zero fields mean the
// documented defaults.
type OAuthOptions struct {
	// Issuer is the authorization server's issuer identifier (required).
	// Its metadata is discovered at RFC 8414's
	// /.well-known/oauth-authorization-server, else OpenID Connect's
	// /.well-known/openid-configuration; the metadata's issuer must be
	// Issuer exactly.
	Issuer string
	// Resource is this server's canonical resource URI (RFC 8707), which
	// every token's aud must contain (required). A token for another
	// audience is refused, never passed on.
	Resource string
	// ClockSkew tolerates clocks this far apart (DefaultClockSkew).
	ClockSkew time.Duration
	// IntrospectionURL, if set, checks tokens that are not JWTs by RFC
	// 7662 introspection, authenticated as ClientID with ClientSecret
	// (HTTP basic). An introspected token must be active, name Resource
	// in its aud, Issuer as iss (when it names one), and be unexpired.
	IntrospectionURL       string
	ClientID, ClientSecret string
	// IntrospectionMaxAge is how long an active token's introspection
	// answer is used without asking again (DefaultIntrospectionMaxAge),
	// never past its exp. It is the trade-off of the cache: a token
	// revoked at the authorization server is accepted until then.
	// Refusals are kept 30 s.
	IntrospectionMaxAge time.Duration
	// MaxIntrospections bounds the introspection requests in flight
	// (DefaultMaxIntrospections); a request needing one more waits 2 s
	// at most, then fails as the server being unavailable.
	MaxIntrospections int
	// HTTPClient makes the requests to the authorization server;
	// nil means one with DefaultHTTPTimeout.
	HTTPClient *http.Client
	// KeysMinRefresh and KeysMaxAge (DefaultKeysMinRefresh,
	// DefaultKeysMaxAge) pace the key set's fetches. KeysMaxAge below
	// KeysMinRefresh is refused by NewOAuth: keys past their max age
	// would be used until KeysMinRefresh passed.
	KeysMinRefresh, KeysMaxAge time.Duration
}

// OAuth is a [Verifier] of OAuth 2.1 access tokens, as a resource server
// per the MCP authorization specification: a JWT access token must be
// signed by a key of the issuer's key set (fetched from its jwks_uri,
// cached, and fetched again when a token names a key it does not hold:
// keys rotate without a restart), with an asymmetric algorithm, name the
// issuer as iss and the resource in aud, and be within exp and nbf. The
// identity's subject is the issuer and sub joined by a space, so that two
// issuers' subjects never meet.
//
// It is safe for concurrent use. Nothing is fetched until the first
// token arrives; an authorization server that cannot be reached then is
// an error that is not [ErrInvalidToken] (the request may be retried).
type OAuth struct {
	o      OAuthOptions
	client *http.Client
	in     *introspections

	mu       sync.Mutex // guards the fields below, never held across a fetch
	jwksURI  string
	keys     jose.JSONWebKeySet
	keysAt   time.Time // when keys were fetched; zero: never
	fetched  time.Time // when the last fetch was tried; zero: never
	fetchErr error     // the last fetch's error, until the next may be tried
	// fetching is closed when the fetch under way ends; nil: none. One
	// at a time: requests that need one wait for it.
	fetching chan struct{}
}

// NewOAuth makes an [OAuth] verifier. It fails if the issuer or resource
// is missing or not an absolute URL.
func NewOAuth(o OAuthOptions) (*OAuth, error) {
	for _, u := range []struct{ name, v string }{{"issuer", o.Issuer}, {"resource", o.Resource}} {
		p, err := url.Parse(u.v)
		if err != nil || p.Scheme == "" || p.Host == "" || p.Fragment != "" {
			return nil, fmt.Errorf("oauth: %s %q: want an absolute URL without a fragment", u.name, u.v)
		}
	}
	if o.ClockSkew <= 0 {
		o.ClockSkew = DefaultClockSkew
	}
	if o.KeysMinRefresh <= 0 {
		o.KeysMinRefresh = DefaultKeysMinRefresh
	}
	if o.KeysMaxAge <= 0 {
		o.KeysMaxAge = DefaultKeysMaxAge
	}
	if o.KeysMaxAge < o.KeysMinRefresh {
		// Keys past their max age are fetched again no sooner than
		// KeysMinRefresh after the last fetch: below it, the max age
		// would not bound the keys' use.
		return nil, fmt.Errorf("oauth: keys_min_refresh (%v) is over keys_max_age (%v): keys past their max age would be used until keys_min_refresh passed", o.KeysMinRefresh, o.KeysMaxAge)
	}
	if o.IntrospectionMaxAge <= 0 {
		o.IntrospectionMaxAge = DefaultIntrospectionMaxAge
	}
	if o.MaxIntrospections <= 0 {
		o.MaxIntrospections = DefaultMaxIntrospections
	}
	client := o.HTTPClient
	if client == nil {
		client = &http.Client{Timeout: DefaultHTTPTimeout}
	}
	return &OAuth{o: o, client: client, in: newIntrospections(o.IntrospectionMaxAge, o.MaxIntrospections)}, nil
}

// Resource is the canonical resource URI tokens must be for.
func (v *OAuth) Resource() string { return v.o.Resource }

// Issuer is the authorization server's issuer identifier.
func (v *OAuth) Issuer() string { return v.o.Issuer }

// accessClaims are the claims read from an access token besides the
// registered ones: scope (RFC 9068, space-separated) or scp (a list, as
// some servers send).
type accessClaims struct {
	Scope string          `json:"scope"`
	Scp   json.RawMessage `json:"scp"`
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidToken, fmt.Sprintf(format, a...))
}

// Verify implements [Verifier].
func (v *OAuth) Verify(ctx context.Context, token string) (Identity, error) {
	if strings.Count(token, ".") != 2 {
		if v.o.IntrospectionURL != "" {
			return v.introspect(ctx, token)
		}
		return Identity{}, invalid("not a JWT")
	}
	tok, err := jwt.ParseSigned(token, signingAlgs)
	if err != nil {
		return Identity{}, invalid("malformed or unsupported signature algorithm (asymmetric algorithms only)")
	}
	if len(tok.Headers) != 1 {
		return Identity{}, invalid("want one signature")
	}
	kid := tok.Headers[0].KeyID
	keys, err := v.keysFor(ctx, kid)
	if err != nil {
		return Identity{}, err
	}
	var std jwt.Claims
	var extra accessClaims
	var all map[string]any
	verified := false
	for _, k := range keys {
		if k.Algorithm != "" && k.Algorithm != tok.Headers[0].Algorithm {
			continue
		}
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		if err := tok.Claims(k.Key, &std, &extra, &all); err == nil {
			verified = true
			break
		}
	}
	if !verified {
		return Identity{}, invalid("signature does not verify with the issuer's keys")
	}
	if std.Expiry == nil {
		return Identity{}, invalid("no exp")
	}
	if std.Subject == "" {
		return Identity{}, invalid("no sub")
	}
	err = std.ValidateWithLeeway(jwt.Expected{Issuer: v.o.Issuer, AnyAudience: jwt.Audience{v.o.Resource}, Time: time.Now()}, v.o.ClockSkew)
	switch {
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return Identity{}, invalid("issued by %q, not %q", std.Issuer, v.o.Issuer)
	case errors.Is(err, jwt.ErrInvalidAudience):
		return Identity{}, invalid("for another audience, not %q", v.o.Resource)
	case errors.Is(err, jwt.ErrExpired):
		return Identity{}, invalid("expired")
	case errors.Is(err, jwt.ErrNotValidYet), errors.Is(err, jwt.ErrIssuedInTheFuture):
		return Identity{}, invalid("not valid yet")
	case err != nil:
		return Identity{}, invalid("%v", err)
	}
	return Identity{
		Subject: v.o.Issuer + " " + std.Subject,
		Scopes:  scopesOf(extra.Scope, extra.Scp),
		Expires: std.Expiry.Time(),
		Claims:  all,
	}, nil
}

// scopesOf reads scope (space-separated) and scp (a list or a string).
func scopesOf(scope string, scp json.RawMessage) []string {
	out := strings.Fields(scope)
	var list []string
	var one string
	if json.Unmarshal(scp, &list) == nil {
		out = append(out, list...)
	} else if json.Unmarshal(scp, &one) == nil {
		out = append(out, strings.Fields(one)...)
	}
	return out
}

// keysFor returns the keys that may have signed a token naming kid ("":
// every key). The key set is fetched on first use, after KeysMaxAge, and
// when kid is unknown, at most once per KeysMinRefresh. A failed fetch
// says nothing of the keys in hand: they are used until KeysMaxAge, so
// that a made-up key ID while the authorization server is down fails
// its own token only, not every one. One fetch at a time, outside the
// lock: it holds up only the requests that need it (the one that starts
// it until it ends, the others as long as their clients wait), where
// under the lock every token waited behind it, for up to the HTTP
// timeout against a server that hangs.
func (v *OAuth) keysFor(ctx context.Context, kid string) ([]jose.JSONWebKey, error) {
	v.mu.Lock()
	fresh := !v.keysAt.IsZero() && time.Since(v.keysAt) <= v.o.KeysMaxAge
	if ks := v.matchLocked(kid); len(ks) > 0 && fresh {
		v.mu.Unlock()
		return ks, nil
	}
	if fetching := v.fetching; fetching != nil {
		// Another request's fetch is under way: its outcome is this
		// one's too.
		v.mu.Unlock()
		select {
		case <-fetching:
		case <-ctx.Done():
			return nil, fmt.Errorf("oauth: the issuer's keys: %w", context.Cause(ctx))
		}
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.fetchedLocked(kid)
	}
	if !v.fetched.IsZero() && time.Since(v.fetched) < v.o.KeysMinRefresh {
		defer v.mu.Unlock()
		return v.fetchedLocked(kid)
	}
	fetching := make(chan struct{})
	v.fetching = fetching
	jwksURI := v.jwksURI
	v.mu.Unlock()
	defer func() {
		// However the fetch ends: after a panic in it, left marked under
		// way, every later token would wait on it until its client's
		// deadline (TestOAuthPanicLeavesNothingHeld). Those waiting read
		// what it left (the keys in hand, if it set none).
		v.mu.Lock()
		v.fetching = nil
		v.mu.Unlock()
		close(fetching)
	}()

	// The fetch is everyone's, not the request's that happens to make
	// it, so it runs on without that request's cancellation: a client
	// hanging up (any JWT-shaped token naming a made-up key ID makes one
	// fetch) would otherwise have its failure stand for every tenant
	// until KeysMinRefresh passed.
	bound := max(v.client.Timeout, DefaultHTTPTimeout)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer cancel()
	set, jwksURI, err := v.fetchKeys(fctx, jwksURI)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.jwksURI = jwksURI
	if err == nil {
		v.keys, v.keysAt = set, time.Now()
	}
	v.fetched, v.fetchErr = time.Now(), err
	return v.fetchedLocked(kid)
}

// matchLocked returns the keys in hand that kid names ("": every key).
// The caller holds v.mu.
func (v *OAuth) matchLocked(kid string) []jose.JSONWebKey {
	if kid == "" {
		return v.keys.Keys
	}
	return v.keys.Key(kid)
}

// fetchedLocked returns the keys kid names as the last fetch left them:
// its error if it failed. The caller holds v.mu.
func (v *OAuth) fetchedLocked(kid string) ([]jose.JSONWebKey, error) {
	if v.fetchErr != nil {
		return nil, fmt.Errorf("oauth: the issuer's keys: %w", v.fetchErr)
	}
	if ks := v.matchLocked(kid); len(ks) > 0 {
		return ks, nil
	}
	return nil, invalid("signed with key %q, which the issuer does not list", kid)
}

// fetchKeys fetches the key set from jwksURI, discovered first if it is
// "", and returns it with jwksURI.
func (v *OAuth) fetchKeys(ctx context.Context, jwksURI string) (jose.JSONWebKeySet, string, error) {
	var set jose.JSONWebKeySet
	if jwksURI == "" {
		meta, err := v.discover(ctx)
		if err != nil {
			return set, "", err
		}
		if meta.JWKSURI == "" {
			return set, "", errors.New("the authorization server's metadata has no jwks_uri")
		}
		jwksURI = meta.JWKSURI
	}
	if err := v.getJSON(ctx, jwksURI, &set); err != nil {
		return set, jwksURI, err
	}
	return set, jwksURI, nil
}

// serverMetadata is what is read of RFC 8414 / OpenID discovery.
type serverMetadata struct {
	Issuer                string `json:"issuer"`
	JWKSURI               string `json:"jwks_uri"`
	IntrospectionEndpoint string `json:"introspection_endpoint"`
}

// discover reads the issuer's metadata: RFC 8414's well-known URI (with
// the issuer's path after it), else OpenID Connect discovery's (with the
// path before it, and after it as RFC 8414 also allows). The metadata
// must name the issuer exactly (RFC 8414 §3.3).
func (v *OAuth) discover(ctx context.Context) (*serverMetadata, error) {
	u, _ := url.Parse(v.o.Issuer)
	path := strings.TrimSuffix(u.Path, "/")
	base := u.Scheme + "://" + u.Host
	candidates := []string{
		base + "/.well-known/oauth-authorization-server" + path,
		base + path + "/.well-known/openid-configuration",
	}
	if path != "" {
		candidates = append(candidates, base+"/.well-known/openid-configuration"+path)
	}
	var errs []error
	for _, c := range candidates {
		var m serverMetadata
		if err := v.getJSON(ctx, c, &m); err != nil {
			errs = append(errs, err)
			continue
		}
		if m.Issuer != v.o.Issuer {
			return nil, fmt.Errorf("metadata at %s names issuer %q, not %q", c, m.Issuer, v.o.Issuer)
		}
		return &m, nil
	}
	return nil, fmt.Errorf("discovery: %w", errors.Join(errs...))
}

// getJSON GETs u and decodes its JSON, bounded in size.
func (v *OAuth) getJSON(ctx context.Context, u string, dst any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	return v.do(req, u, dst)
}

func (v *OAuth) do(req *http.Request, u string, dst any) error {
	resp, err := v.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxDocument+1))
	if err != nil {
		return fmt.Errorf("%s: %w", u, err)
	}
	if len(b) > maxDocument {
		return fmt.Errorf("%s: over %d bytes", u, maxDocument)
	}
	if err := json.Unmarshal(b, dst); err != nil {
		return fmt.Errorf("%s: %w", u, err)
	}
	return nil
}

// introspection is what is read of an RFC 7662 response.
type introspection struct {
	Active bool            `json:"active"`
	Sub    string          `json:"sub"`
	Iss    string          `json:"iss"`
	Scope  string          `json:"scope"`
	Exp    int64           `json:"exp"`
	Nbf    int64           `json:"nbf"`
	Aud    json.RawMessage `json:"aud"`
}

// introspectNow asks the authorization server about an opaque token (RFC
// 7662) and checks its answer; introspect calls it.
func (v *OAuth) introspectNow(ctx context.Context, token string) (Identity, error) {
	form := url.Values{"token": {token}, "token_type_hint": {"access_token"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, v.o.IntrospectionURL, strings.NewReader(form.Encode()))
	if err != nil {
		return Identity{}, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(v.o.ClientID), url.QueryEscape(v.o.ClientSecret))
	var in introspection
	if err := v.do(req, v.o.IntrospectionURL, &in); err != nil {
		return Identity{}, fmt.Errorf("oauth: introspection: %w", err)
	}
	now := time.Now()
	switch {
	case !in.Active:
		return Identity{}, invalid("not active")
	case in.Sub == "":
		return Identity{}, invalid("no sub")
	case in.Iss != "" && in.Iss != v.o.Issuer:
		return Identity{}, invalid("issued by %q, not %q", in.Iss, v.o.Issuer)
	case in.Exp == 0:
		return Identity{}, invalid("no exp")
	case now.Add(-v.o.ClockSkew).After(time.Unix(in.Exp, 0)):
		return Identity{}, invalid("expired")
	case in.Nbf != 0 && now.Add(v.o.ClockSkew).Before(time.Unix(in.Nbf, 0)):
		return Identity{}, invalid("not valid yet")
	}
	// The token must be for this resource: an introspection answer that
	// names no audience cannot say so.
	var aud jwt.Audience
	if len(in.Aud) == 0 || json.Unmarshal(in.Aud, &aud) != nil || !aud.Contains(v.o.Resource) {
		return Identity{}, invalid("not for this resource %q", v.o.Resource)
	}
	return Identity{Subject: v.o.Issuer + " " + in.Sub, Scopes: strings.Fields(in.Scope), Expires: time.Unix(in.Exp, 0)}, nil
}
