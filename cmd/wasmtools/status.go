package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/wasmtools/wasmtools/plugins"
)

func cmdStatus(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:8080", "the `URL` of a running \"wasmtools serve --http\" server")
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: wasmtools status [--url URL] [--json]\n\nShows each plugin a running HTTP server serves: version (sha256), state\n(loaded; error or retrying, with the reason; disabled), tools, live\ninstances and the time of its last reload; and each session's run-time\ngrant questions. WASMTOOLS_OPERATOR_TOKEN, if set, is sent as the bearer\ntoken (without an operator credential, the server answers /status on its\nown machine only).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return flagsExit(err)
	}
	var rep statusReport
	if code := requestJSON(ctx, "status", http.MethodGet, baseURL(*url)+"/status", operatorToken(lookupEnv), 10*time.Second, &rep, stderr); code != 0 {
		return code
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PLUGIN\tSTATE\tVERSION\tINSTANCES\tLAST RELOAD\tTOOLS")
	for _, p := range rep.Plugins {
		version := "-"
		if len(p.SHA256) >= 12 {
			version = p.SHA256[:12]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", p.Name, p.State, version, p.LiveInstances, p.LastReload.Format(time.RFC3339), strings.Join(p.Tools, ","))
	}
	tw.Flush()
	for _, p := range rep.Plugins {
		if s := p.Source; s != nil {
			fmt.Fprintf(stdout, "\n%s: %s\n  digest:   %s\n  verified: %s\n", p.Name, s.Source, cmpOr(s.Digest, "-"), cmpOr(s.Verified, "-"))
		}
	}
	for _, p := range rep.Plugins {
		if p.Error != "" {
			fmt.Fprintf(stdout, "\n%s (%s): %s\n", p.Name, p.Path, p.Error)
		}
		if p.State == plugins.StateRetrying && !p.RetryAt.IsZero() {
			fmt.Fprintf(stdout, "  tried again at %s\n", p.RetryAt.Format(time.RFC3339))
		}
	}
	if len(rep.Grants) > 0 {
		fmt.Fprintln(stdout, "\nrun-time grants:")
		tw = tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  SESSION\tASKED\tGIVEN\tREFUSED")
		for _, g := range rep.Grants {
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\n", g.Session, g.Asked, g.Given, g.Refused)
		}
		tw.Flush()
	}
	return 0
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// baseURL is a server's URL as a user gives it, without /mcp.
func baseURL(u string) string {
	return strings.TrimSuffix(strings.TrimSuffix(u, "/"), "/mcp")
}

// requestJSON asks url (with token as bearer token, if set) within
// timeout and decodes the JSON answer into v; it returns the command's
// exit code, the error said on stderr as cmd's.
func requestJSON(ctx context.Context, cmd, method, url, token string, timeout time.Duration, v any, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		fmt.Fprintf(stderr, "wasmtools %s: %v\n", cmd, err)
		return 2
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "wasmtools %s: %v (is `wasmtools serve --http` running there?)\n", cmd, err)
		return 1
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "wasmtools %s: %s answered %s%s\n", cmd, req.URL, resp.Status, refusalText(resp, token != ""))
		return 1
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(v); err != nil {
		fmt.Fprintf(stderr, "wasmtools %s: %v\n", cmd, err)
		return 1
	}
	return 0
}

// refusalText is what a refused operator request says to the user: the
// server's own reason (its body, cut and stripped of control characters,
// since any server may answer) and, for 401/403, where the token comes
// from.
func refusalText(resp *http.Response, sent bool) string {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	why := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			return ' '
		}
		return r
	}, strings.TrimSpace(string(b)))
	var out string
	if why != "" {
		out = ": " + why
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		if !sent {
			out += " (set WASMTOOLS_OPERATOR_TOKEN to the server's operator token, http.operator_token)"
		} else {
			out += " (WASMTOOLS_OPERATOR_TOKEN is not this server's operator credential)"
		}
	}
	return out
}

// operatorToken is the token `wasmtools status` and `wasmtools reload`
// send: WASMTOOLS_OPERATOR_TOKEN.
func operatorToken(lookupEnv func(string) (string, bool)) string {
	v, _ := lookupEnv("WASMTOOLS_OPERATOR_TOKEN")
	return v
}
