// Package authtest runs an OAuth authorization server's public side on
// loopback for tests: OpenID discovery, a key set that can rotate, RFC
// 7662 introspection, and a client-credentials token endpoint; and it
// mints access tokens, well and badly formed, with its keys or others.
package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Key is a signing key and its key ID.
type Key struct {
	ID      string
	Private any // *rsa.PrivateKey or *ecdsa.PrivateKey
	Alg     jose.SignatureAlgorithm
}

// NewRSAKey makes an RS256 key named id.
func NewRSAKey(t testing.TB, id string) Key {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return Key{ID: id, Private: k, Alg: jose.RS256}
}

// NewECKey makes an ES256 key named id.
func NewECKey(t testing.TB, id string) Key {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return Key{ID: id, Private: k, Alg: jose.ES256}
}

func (k Key) public() any {
	switch p := k.Private.(type) {
	case *rsa.PrivateKey:
		return &p.PublicKey
	case *ecdsa.PrivateKey:
		return &p.PublicKey
	}
	return nil
}

// Server is the authorization server.
type Server struct {
	URL string // the issuer
	t   testing.TB

	mu      sync.Mutex
	keys    []Key
	clients map[string]string // client credentials: id → secret
	// Resource is the audience of the tokens the token endpoint issues.
	resource string
	opaque   map[string]map[string]any // introspection: token → response
	held     *hold                     // the key set's requests held; nil: none

	KeyFetches atomic.Int64
	// Down, while set, makes every endpoint answer 503, as an
	// authorization server that is down.
	Down atomic.Bool
	// Introspections counts the introspection requests answered.
	Introspections atomic.Int64
}

// NewServer starts a server on 127.0.0.1 with one RSA key, "k1", which
// issues tokens for resource. It stops at the test's end.
func NewServer(t testing.TB, resource string) *Server {
	s := &Server{t: t, keys: []Key{NewRSAKey(t, "k1")}, clients: map[string]string{}, resource: resource, opaque: map[string]map[string]any{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{
			"issuer": s.URL, "jwks_uri": s.URL + "/keys", "token_endpoint": s.URL + "/token",
			"introspection_endpoint":   s.URL + "/introspect",
			"grant_types_supported":    []string{"client_credentials"},
			"response_types_supported": []string{"code"}, "subject_types_supported": []string{"public"},
			"id_token_signing_alg_values_supported": []string{"RS256", "ES256"},
		})
	})
	mux.HandleFunc("/keys", func(w http.ResponseWriter, r *http.Request) {
		s.KeyFetches.Add(1)
		s.mu.Lock()
		h := s.held
		s.mu.Unlock()
		if h != nil {
			h.arrived <- struct{}{}
			select {
			case <-h.release:
			case <-r.Context().Done():
				return
			}
		}
		s.mu.Lock()
		var set jose.JSONWebKeySet
		for _, k := range s.keys {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.public(), KeyID: k.ID, Algorithm: string(k.Alg), Use: "sig"})
		}
		s.mu.Unlock()
		writeJSON(w, set)
	})
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		id, secret, ok := r.BasicAuth()
		if !ok {
			r.ParseForm()
			id, secret = r.PostFormValue("client_id"), r.PostFormValue("client_secret")
		}
		s.mu.Lock()
		want, known := s.clients[id]
		s.mu.Unlock()
		if r.PostFormValue("grant_type") != "client_credentials" || !known || want != secret {
			w.WriteHeader(http.StatusUnauthorized)
			writeJSON(w, map[string]any{"error": "invalid_client"})
			return
		}
		claims := map[string]any{"sub": id, "scope": r.PostFormValue("scope")}
		if res := r.PostFormValue("resource"); res != "" {
			claims["aud"] = res
		}
		writeJSON(w, map[string]any{"access_token": s.Mint(claims), "token_type": "Bearer", "expires_in": 300})
	})
	mux.HandleFunc("/introspect", func(w http.ResponseWriter, r *http.Request) {
		s.Introspections.Add(1)
		id, secret, ok := r.BasicAuth()
		s.mu.Lock()
		want, known := s.clients[id]
		resp, found := s.opaque[r.PostFormValue("token")]
		s.mu.Unlock()
		if !ok || !known || want != secret {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if !found {
			resp = map[string]any{"active": false}
		}
		writeJSON(w, resp)
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.Down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// AddClient registers client credentials for the token and
// introspection endpoints.
func (s *Server) AddClient(id, secret string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients[id] = secret
}

// Rotate replaces the key set with k: tokens signed with the old keys no
// longer verify.
func (s *Server) Rotate(k Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = []Key{k}
}

// hold is the key set's requests held by HoldKeys.
type hold struct {
	arrived chan struct{} // one per request held
	release chan struct{} // closed to answer them
}

// HoldKeys makes the key set's endpoint answer no request, as an
// authorization server that hangs, until release is called (also at the
// test's end); arrived receives one value per request held.
func (s *Server) HoldKeys() (arrived <-chan struct{}, release func()) {
	h := &hold{arrived: make(chan struct{}, 100), release: make(chan struct{})}
	s.mu.Lock()
	s.held = h
	s.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			s.mu.Lock()
			s.held = nil
			s.mu.Unlock()
			close(h.release)
		})
	}
	s.t.Cleanup(release)
	return h.arrived, release
}

// AddOpaque makes token an opaque token whose introspection answers
// resp.
func (s *Server) AddOpaque(token string, resp map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opaque[token] = resp
}

// Claims are a token's claims before defaults: iss (the server), aud
// (the resource), exp (in 5 minutes), iat and nbf (now) are added unless
// given; a value of nil leaves the claim out.
func (s *Server) claims(c map[string]any) map[string]any {
	now := time.Now()
	out := map[string]any{"iss": s.URL, "aud": s.resource, "exp": now.Add(5 * time.Minute).Unix(), "iat": now.Unix(), "nbf": now.Unix()}
	for k, v := range c {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return out
}

// Mint signs claims (with the defaults) with the server's current key.
func (s *Server) Mint(c map[string]any) string {
	s.mu.Lock()
	k := s.keys[0]
	s.mu.Unlock()
	return s.MintWith(k, c)
}

// MintWith signs claims (with the defaults) with k, naming k.ID.
func (s *Server) MintWith(k Key, c map[string]any) string {
	return s.sign(jose.SigningKey{Algorithm: k.Alg, Key: k.Private}, (&jose.SignerOptions{}).WithType("at+jwt").WithHeader("kid", k.ID), c)
}

// sign signs claims (with the defaults) with key.
func (s *Server) sign(key jose.SigningKey, opts *jose.SignerOptions, c map[string]any) string {
	signer, err := jose.NewSigner(key, opts)
	if err != nil {
		s.t.Fatal(err)
	}
	payload, _ := json.Marshal(s.claims(c))
	obj, err := signer.Sign(payload)
	if err != nil {
		s.t.Fatal(err)
	}
	tok, _ := obj.CompactSerialize()
	return tok
}

// MintNone is an unsigned token: alg "none", no signature.
func (s *Server) MintNone(c map[string]any) string {
	h, _ := json.Marshal(map[string]any{"alg": "none", "typ": "at+jwt", "kid": "k1"})
	p, _ := json.Marshal(s.claims(c))
	return b64(h) + "." + b64(p) + "."
}

// MintHMACWithPublicKey is the classic key-confusion token: HS256 with
// the server's RSA public key (its DER and PEM forms alike) as the secret.
func (s *Server) MintHMACWithPublicKey(c map[string]any) string {
	s.mu.Lock()
	k := s.keys[0]
	s.mu.Unlock()
	der, err := x509.MarshalPKIXPublicKey(k.public())
	if err != nil {
		s.t.Fatal(err)
	}
	return s.sign(jose.SigningKey{Algorithm: jose.HS256, Key: der}, (&jose.SignerOptions{}).WithHeader("kid", k.ID), c)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// String names the server in failures.
func (s *Server) String() string {
	return fmt.Sprintf("authorization server %s", strings.TrimPrefix(s.URL, "http://"))
}
