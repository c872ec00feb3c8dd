package sessions

import "fmt"

// ServerFull is the refusal, matching err, of what a bound of the whole
// server (over every tenant) has no room for, bound naming it. It says no
// figure of what the server holds: that is every tenant's usage, which a
// client must not learn from a refusal (a tenant review found "the server
// holds %d listen streams"); the operator's metrics say it
// (wasmtools_http_sessions, wasmtools_instances_live, ...).
func ServerFull(err error, bound string) error {
	return fmt.Errorf("%w: %s are at the most the server holds in all; retry later", err, bound)
}
