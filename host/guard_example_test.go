package host_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/wasmtools/wasmtools/host"
)

// ExampleGuard puts an endpoint behind the checks wasmtools gives every
// HTTP endpoint: the bearer token, the Host check against DNS rebinding,
// and the Origin check against cross-origin browser requests.
func ExampleGuard() {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	srv := httptest.NewServer(host.Guard(mux, host.GuardOptions{Token: "s3cret"})) // on 127.0.0.1
	defer srv.Close()

	try := func(what string, edit func(*http.Request)) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/healthz", nil)
		req.Header.Set("Authorization", "Bearer s3cret")
		edit(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(what+":", resp.StatusCode)
	}
	try("with the token", func(*http.Request) {})
	try("without it", func(r *http.Request) { r.Header.Del("Authorization") })
	try("rebound Host", func(r *http.Request) { r.Host = "attacker.example" })
	try("cross-site page", func(r *http.Request) {
		r.Header.Set("Origin", "http://attacker.example")
		r.Header.Set("Sec-Fetch-Site", "cross-site")
	})
	// Output:
	// with the token: 200
	// without it: 401
	// rebound Host: 403
	// cross-site page: 403
}
