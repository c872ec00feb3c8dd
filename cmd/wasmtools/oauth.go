package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	wauth "github.com/wasmtools/wasmtools/internal/auth"
	"github.com/wasmtools/wasmtools/internal/config"
)

// resourceServer is what [http.oauth] makes of wasmtools: a verifier of
// the authorization server's access tokens, and the protected resource
// metadata (RFC 9728) that tells MCP clients where to get them.
type resourceServer struct {
	verifier *wauth.OAuth
	// metadataURL is the metadata's URL for the resource, sent in every
	// WWW-Authenticate challenge: the well-known path with the
	// resource's path after it (RFC 9728 §3.1).
	metadataURL string
	// metadataPaths are where it is served: the path form, and the bare
	// well-known path that clients try next.
	metadataPaths []string
	metadata      http.Handler
}

func newResourceServer(c config.OAuth) (*resourceServer, error) {
	v, err := wauth.NewOAuth(wauth.OAuthOptions{
		Issuer: c.Issuer, Resource: c.Resource, ClockSkew: time.Duration(c.ClockSkew), KeysMinRefresh: time.Duration(c.KeysMinRefresh),
		IntrospectionURL: c.IntrospectionURL, ClientID: c.ClientID, ClientSecret: c.ClientSecret,
		IntrospectionMaxAge: time.Duration(c.IntrospectionMaxAge), MaxIntrospections: c.MaxIntrospections,
	})
	if err != nil {
		return nil, fmt.Errorf("http.%w", err)
	}
	u, _ := url.Parse(c.Resource)
	const wellKnown = "/.well-known/oauth-protected-resource"
	path := strings.TrimSuffix(u.EscapedPath(), "/")
	rs := &resourceServer{
		verifier:      v,
		metadataURL:   u.Scheme + "://" + u.Host + wellKnown + path,
		metadataPaths: []string{wellKnown},
		metadata: auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
			Resource:               c.Resource,
			AuthorizationServers:   []string{c.Issuer},
			ScopesSupported:        c.Scopes,
			BearerMethodsSupported: []string{"header"},
			ResourceName:           "wasmtools",
		}),
	}
	if path != "" {
		rs.metadataPaths = append(rs.metadataPaths, wellKnown+path)
	}
	return rs, nil
}
