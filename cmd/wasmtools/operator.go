package main

import (
	"net"
	"net/http"
	"net/netip"

	wauth "github.com/wasmtools/wasmtools/internal/auth"
	"github.com/wasmtools/wasmtools/sandbox"
)

// operatorPaths are the endpoints only the operator may use: they stop,
// reload and inspect the whole server, every tenant's plugins included.
var operatorPaths = []string{"/drain", "/reload", "/status", "/metrics"}

// operatorGate keeps the operator's endpoints from the tenants.
//
// With an operator credential configured (an operator token, subjects or
// a scope), a request must carry it: no token is refused with 401, a
// tenant's valid token with 403 insufficient_scope. Without one, /drain
// and /reload are not served over HTTP at all (404; SIGTERM and SIGHUP
// still work) and /status and /metrics answer only requests made on this
// machine: a loopback peer that no proxy forwarded.
type operatorGate struct {
	op wauth.Operator
	// tenants verifies the tenants' tokens, for operator subjects and
	// scopes; nil when tenants have none.
	tenants wauth.Verifier
	// resourceMetadata goes in the challenges, as on /mcp.
	resourceMetadata string
}

// wrap gates next. localWithout says whether next is served to local
// requests when no operator credential is configured (/status, /metrics)
// or not at all (/drain, /reload).
func (g operatorGate) wrap(next http.Handler, localWithout bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.op.Configured() {
			switch {
			case !localWithout:
				http.Error(w, "not served over HTTP without an operator credential (http.operator_token); use a signal", http.StatusNotFound)
			case !localRequest(r):
				http.Error(w, "forbidden: served only on this machine without an operator credential (http.operator_token)", http.StatusForbidden)
			default:
				next.ServeHTTP(w, r)
			}
			return
		}
		refuse := func(code int, c wauth.Challenge) {
			c.ResourceMetadata = g.resourceMetadata
			if g.op.Scope != "" && c.Error != "invalid_token" {
				c.Scope = g.op.Scope
			}
			w.Header().Set("WWW-Authenticate", c.String())
			http.Error(w, c.Description, code)
		}
		token := wauth.BearerToken(r.Header.Get("Authorization"))
		switch {
		case token == "":
			refuse(http.StatusUnauthorized, wauth.Challenge{Description: "the operator's token is needed"})
			return
		case g.op.IsToken(token):
			next.ServeHTTP(w, r)
			return
		case g.tenants == nil:
			refuse(http.StatusUnauthorized, wauth.Challenge{Error: "invalid_token", Description: "not the operator's token"})
			return
		}
		id, err := g.tenants.Verify(r.Context(), token)
		switch {
		case err != nil:
			refuse(http.StatusUnauthorized, wauth.Challenge{Error: "invalid_token", Description: "not the operator's token"})
		case !g.op.Allows(id):
			refuse(http.StatusForbidden, wauth.Challenge{Error: "insufficient_scope", Description: "the operator's endpoints are not a tenant's"})
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// localRequest reports whether r came from this machine: a loopback peer,
// with none of the headers a proxy adds (a proxy on this machine makes
// every client a loopback peer), that is not a guest's connection
// (sandbox.GuestPeer).
func localRequest(r *http.Request) bool {
	for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Real-Ip"} {
		if r.Header.Get(h) != "" {
			return false
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	// A plugin's http_request to this server's own port is this process
	// acting for whichever tenant called it (red team, round four).
	if local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr); sandbox.GuestPeer(r.RemoteAddr, local) {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
