package host

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/sandbox"
)

// The host functions hyper-mcp's plugins import beyond progress, logging,
// elicitation and sampling: roots, keyring secrets, OAuth access tokens,
// and the end of a URL elicitation. Their JSON shapes are hyper-mcp's
// (src/service.rs), so its plugins run unmodified.

// listRoots serves list_roots: the client's roots, asked with roots/list
// of a client before 2026-07-28, or through an input-required result of a
// 2026-07-28 client (the call parks, as for elicitation). A client that
// offers no roots has none, as hyper-mcp answers; why is in
// _meta["dev.wasmtools/error"].
func (e *callEnv) listRoots(ctx context.Context) *mcp.ListRootsResult {
	q := &question{key: "roots", roots: &mcp.ListRootsParams{}, rooted: make(chan *mcp.ListRootsResult, 1)}
	_, req := e.current()
	if e.questions != nil {
		if a, ok := ask(ctx, e, q, q.rooted); ok {
			return rootsOf(a)
		}
		return noRoots("the call was cancelled")
	}
	ss := req.Session
	ip := ss.InitializeParams()
	switch {
	case ip == nil || ip.Capabilities == nil || ip.Capabilities.RootsV2 == nil:
		return noRoots("the client does not offer roots")
	case protocolOf(req) >= sessionlessProtocol:
		// Unreachable in practice: a plugin that imports list_roots
		// runs on a goroutine of its own (see Host.call).
		return noRoots("roots are available to " + sessionlessProtocol + " clients only through an input request")
	}
	e.waitForPerson(ctx, func() {
		actx, done := e.h.asks.add(ctx)
		q.askLegacy(actx, ss)
		done()
	})
	select {
	case a := <-q.rooted:
		return rootsOf(a)
	default:
		return noRoots("the call was cancelled")
	}
}

func noRoots(why string) *mcp.ListRootsResult {
	return &mcp.ListRootsResult{Roots: []*mcp.Root{}, Meta: mcp.Meta{"dev.wasmtools/error": why}}
}

// rootsOf keeps the guest's answer a list, never null.
func rootsOf(r *mcp.ListRootsResult) *mcp.ListRootsResult {
	if r.Roots == nil {
		r.Roots = []*mcp.Root{}
	}
	return r
}

// keyringSecret serves get_keyring_secret from the secrets the operator
// granted the plugin ([plugins.NAME.secrets]). hyper-mcp reads the OS
// keyring; wasmtools serves only what the configuration grants, and
// refuses anything else with an error naming the grant (the call fails,
// where hyper-mcp would answer empty bytes that a plugin cannot tell from
// an empty secret).
//
// A secret in the plugin's ceiling ([plugins.NAME.ask.secrets]) is served
// once the person using the client approves it (see AskGrant).
func (e *callEnv) keyringSecret(ctx context.Context, input []byte) ([]byte, error) {
	var k abi.KeyringEntry
	if err := json.Unmarshal(input, &k); err != nil || k.Service == "" || k.User == "" {
		return nil, errors.New(`input must be {"service": "...", "user": "..."}`)
	}
	p := e.plugin
	v, ok := p.Secret(k.Service, k.User)
	if !ok {
		if v, ok = p.AskSecret(k.Service, k.User); ok {
			if err := e.AskGrant(ctx, sandbox.GrantRequest{Kind: grantSecret, Target: k.Service + "/" + k.User}); err != nil {
				return nil, err
			}
			e.h.log.Info("keyring secret served", "plugin", p.Name(), "secret", k.Service+"/"+k.User, "approved", true)
			return []byte(v), nil
		}
		name := cutString(k.Service+"/"+k.User, 256) // the guest's string, in an error and the log
		return nil, fmt.Errorf("secret %q is not granted to plugin %q: the operator grants it with %q = ... in [plugins.%s.secrets]", name, p.Name(), name, p.Name())
	}
	e.h.log.Info("keyring secret served", "plugin", p.Name(), "secret", k.Service+"/"+k.User)
	return []byte(v), nil
}

// accessToken serves get_access_token: a token the operator configured
// for the credentials' client_id ([plugins.NAME.access_tokens]), else an
// OAuth 2.0 client-credentials grant at the credentials' token endpoint,
// made through the plugin's own network grant and cached until shortly
// before it expires. hyper-mcp's device-code flow is not offered.
func (e *callEnv) accessToken(ctx context.Context, input []byte) abi.AccessTokenResult {
	var c abi.OAuthCredentials
	if err := json.Unmarshal(input, &c); err != nil || c.ClientID == "" {
		return abi.AccessTokenResult{Error: `input must be OAuth credentials: {"client_id": "...", "token_endpoint_url": "...", ...}`}
	}
	p := e.plugin
	if tok, ok := p.AccessToken(c.ClientID); ok {
		return abi.AccessTokenResult{AccessToken: &abi.AccessToken{AccessToken: tok, Scopes: c.Scopes}}
	}
	if c.DeviceAuthorizationURL != "" {
		return abi.AccessTokenResult{Error: fmt.Sprintf("the device-code flow is not offered: configure a token for client %q in [plugins.%s.access_tokens]", c.ClientID, p.Name())}
	}
	if c.TokenEndpointURL == "" {
		return abi.AccessTokenResult{Error: fmt.Sprintf("no token is configured for client %q in [plugins.%s.access_tokens], and the credentials name no token_endpoint_url", c.ClientID, p.Name())}
	}
	key := p.Name() + "\x00" + credentialsKey(input)
	if tok, ok := e.h.tokens.get(key); ok {
		return abi.AccessTokenResult{AccessToken: tok}
	}
	client, err := p.HTTPClient(c.TokenEndpointURL)
	if err != nil {
		return abi.AccessTokenResult{Error: "token endpoint: " + err.Error()}
	}
	cfg := clientcredentials.Config{
		ClientID: c.ClientID, ClientSecret: c.ClientSecret, TokenURL: c.TokenEndpointURL,
		Scopes: c.Scopes, AuthStyle: oauth2.AuthStyleAutoDetect,
	}
	switch c.AuthType {
	case "BasicAuth":
		cfg.AuthStyle = oauth2.AuthStyleInHeader
	case "RequestBody":
		cfg.AuthStyle = oauth2.AuthStyleInParams
	}
	if len(c.ExtraParams) > 0 {
		cfg.EndpointParams = map[string][]string{}
		for k, v := range c.ExtraParams {
			cfg.EndpointParams.Set(k, v)
		}
	}
	t, err := cfg.Token(context.WithValue(ctx, oauth2.HTTPClient, client))
	if err != nil {
		// Cut: the client ID is the guest's input, and the error holds
		// the token endpoint's answer (a red team, stop 64: half a MiB
		// in one log line).
		e.h.log.Warn("access token refused", "plugin", p.Name(), "client", telemetry.Cut(c.ClientID, 256), "err", telemetry.Cut(err.Error(), 1024))
		return abi.AccessTokenResult{Error: "token request failed: " + err.Error()}
	}
	tok := &abi.AccessToken{AccessToken: t.AccessToken, Scopes: c.Scopes}
	if s, ok := t.Extra("scope").(string); ok && s != "" {
		tok.Scopes = strings.Fields(s)
	}
	if !t.Expiry.IsZero() {
		tok.ExpiresAt = &abi.SystemTime{Secs: t.Expiry.Unix(), Nanos: int64(t.Expiry.Nanosecond())}
	}
	e.h.tokens.put(key, tok, t.Expiry)
	return abi.AccessTokenResult{AccessToken: tok}
}

func credentialsKey(input []byte) string {
	var v any
	json.Unmarshal(input, &v)
	b, _ := json.Marshal(v) // canonical: map keys sorted
	sum := sha256.Sum256(b)
	return string(sum[:])
}

// elicitationComplete serves notify_url_elicitation_completed: it tells
// the client, on the call's request, that a URL elicitation is done.
func (e *callEnv) elicitationComplete(p *mcp.ElicitationCompleteParams) error {
	if len(p.ElicitationID) > maxElicitationID {
		return fmt.Errorf("elicitationId of %d bytes is over the %d-byte limit", len(p.ElicitationID), maxElicitationID)
	}
	if ok, why := e.spendURL(p.ElicitationID); !ok {
		// Dropped, not an error: a looping guest is bounded, not killed.
		e.mu.Lock()
		e.completionsDropped++
		first := e.completionsDropped == 1
		e.mu.Unlock()
		if first {
			e.h.log.Info("URL elicitation completion dropped", "plugin", e.plugin.Name(), "session", e.sess, "why", why)
		}
		return nil
	}
	ctx, req := e.current()
	if err := req.Session.NotifyElicitationComplete(ctx, p); err != nil {
		e.h.log.Debug("elicitation complete not sent", "run", e.name, "err", err)
	}
	return nil
}

// tokenCache keeps the access tokens of client-credentials grants until
// tokenSkew before they expire. It is bounded: at maxTokens, the entry
// that expires first goes.
type tokenCache struct {
	mu sync.Mutex
	m  map[string]cachedToken
}

type cachedToken struct {
	tok    *abi.AccessToken
	expiry time.Time // zero: does not expire
}

const (
	maxTokens = 256
	tokenSkew = 30 * time.Second // hyper-mcp's EXPIRY_SKEW
)

func (c *tokenCache) get(key string) (*abi.AccessToken, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.m[key]
	if !ok {
		return nil, false
	}
	if !t.expiry.IsZero() && time.Now().Add(tokenSkew).After(t.expiry) {
		delete(c.m, key)
		return nil, false
	}
	return t.tok, true
}

func (c *tokenCache) put(key string, tok *abi.AccessToken, expiry time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]cachedToken{}
	}
	if _, ok := c.m[key]; !ok && len(c.m) >= maxTokens {
		var first string
		var at time.Time
		for k, t := range c.m {
			if first == "" || !t.expiry.IsZero() && (at.IsZero() || t.expiry.Before(at)) {
				first, at = k, t.expiry
			}
		}
		delete(c.m, first)
	}
	c.m[key] = cachedToken{tok: tok, expiry: expiry}
}

// rootsChanged delivers a client's notifications/roots/list_changed to
// the on_roots_list_changed export of each v2 plugin of which the client
// has an instance (none is started for it). Delivery runs after the
// handler returns, one at a time per client and plugin: notifications
// that arrive while one is delivered are folded into one more, so that a
// client cannot queue guest calls with a flood of them.
func (h *Host) rootsChanged(req *mcp.RootsListChangedRequest) {
	var meta mcp.Meta
	if req.Params != nil {
		meta = req.Params.Meta
	}
	key, err := h.requestKey(req.Session, req.Extra, meta)
	if err != nil {
		return
	}
	raw := json.RawMessage(`{}`)
	if m := withoutHandle(meta); len(m) > 0 {
		raw, _ = json.Marshal(m)
	}
	// Each delivery runs a guest for the notification's subject: admitted
	// as its calls are (its rate and its share of calls in flight), and
	// dropped when refused. A review found a subject past its share of
	// calls running guests still, one per notification.
	subject, overHTTP := subjectOf(req.Extra), req.Extra != nil && req.Extra.Header != nil
	var tenantCtx context.Context = context.Background()
	if h.opts.Tenants {
		tenantCtx = context.WithValue(tenantCtx, tenantKey{}, h.tenantOf(subject))
	}
	cat := h.Catalogue()
	if cat == nil {
		return
	}
	for _, p := range cat.Plugins() {
		if !p.HasExport(abi.ExportOnRootsListChanged) || !h.ses.Holds(key, p.Name()) {
			continue
		}
		d := rootsDelivery{key: key.String(), plugin: p.Name()}
		h.rootsMu.Lock()
		if _, busy := h.rootsPending[d]; busy {
			h.rootsPending[d] = true // one more after the running one
			h.rootsMu.Unlock()
			continue
		}
		if !h.track() {
			h.rootsMu.Unlock()
			return
		}
		if h.rootsPending == nil {
			h.rootsPending = map[rootsDelivery]bool{}
		}
		h.rootsPending[d] = false
		h.rootsMu.Unlock()
		go func() {
			defer h.wg.Done()
			for {
				// The guest's own call timeout bounds the call; this
				// bounds the wait for the client's instance.
				ctx, cancel := context.WithTimeout(tenantCtx, rootsDeliveryWait)
				release, err := func() {}, error(nil)
				if overHTTP {
					release, err = h.admitCall(subject, p, key)
				}
				if err == nil {
					l, aerr := h.ses.Acquire(ctx, key, p)
					if err = aerr; err == nil {
						err = l.Instance().RootsListChanged(l.Context(), raw)
						l.Done(err)
					}
					release()
				}
				cancel()
				if err != nil {
					h.log.Debug("on_roots_list_changed not delivered", "plugin", p.Name(), "session", key.String(), "err", err)
				} else {
					h.log.Debug("on_roots_list_changed delivered", "plugin", p.Name(), "session", key.String())
				}
				h.rootsMu.Lock()
				again := h.rootsPending[d]
				if again {
					h.rootsPending[d] = false
				} else {
					delete(h.rootsPending, d)
				}
				h.rootsMu.Unlock()
				if !again {
					return
				}
			}
		}()
	}
}

// rootsDeliveryWait bounds how long a roots notification waits for the
// client's instance (a call may be running on it).
const rootsDeliveryWait = time.Minute

type rootsDelivery struct{ key, plugin string }
