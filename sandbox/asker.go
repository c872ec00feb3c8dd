package sandbox

import (
	"context"
	"fmt"
)

// GrantKind says what a [GrantRequest] is for.
type GrantKind string

// The kinds of grant the sandbox asks for.
const (
	// GrantNetwork is a host and port an http_request (or a redirect hop)
	// goes to.
	GrantNetwork GrantKind = "network"
)

// GrantRequest is a grant a guest needs that its policy does not give but
// allows to be asked for (see [Network.Ask]).
type GrantRequest struct {
	Kind GrantKind
	// Target is what is asked for: for GrantNetwork the host and port,
	// "api.example.com:443", "[::1]:8080".
	Target string
	// Mode is, for GrantFile, what is asked of the folder Target (an
	// absolute host path): [ModeRead] or [ModeReadWrite].
	Mode string
	// Redirect is set when a redirect hop needs the grant. An Asker should
	// answer it from what it already knows and ask no one: the request's
	// own timeout runs meanwhile.
	Redirect bool
}

// Asker decides, at run time, a grant that the operator's ceiling allows
// but did not give: it returns nil to grant it for this request, or an
// error whose text the guest sees as the refusal. The sandbox knows
// nothing of who decides or how (the host asks the person through its
// client); it only calls the Asker from the goroutine running the guest,
// and the Asker's time counts against the call's timeout but for the time
// it waits for a person, which it brackets with [PauseDeadline] (what it
// answers from memory, or refuses, counts). What the Asker answers is not
// remembered by the sandbox: an Asker that grants for longer than one
// request remembers that itself.
type Asker interface {
	AskGrant(ctx context.Context, r GrantRequest) error
}

type askerKey struct{}

// WithAsker returns ctx carrying a: the calls of [Instance.Call] made with
// it ask a for grants inside the ceiling. Without one, a grant that is
// not given is refused, as though no ceiling were configured.
func WithAsker(ctx context.Context, a Asker) context.Context {
	return context.WithValue(ctx, askerKey{}, a)
}

// askGrant asks the Asker in ctx for r; it fails when ctx carries no
// Asker. It runs on the guest's goroutine, inside a host function (a
// request, or a redirect of one, a file opened), and ends the call there
// if the call's context ended meanwhile (see endedMeanwhile).
func askGrant(ctx context.Context, r GrantRequest) error {
	a, _ := ctx.Value(askerKey{}).(Asker)
	if a == nil {
		return fmt.Errorf("no one can be asked for %s", r.Target)
	}
	err := a.AskGrant(ctx, r)
	endedMeanwhile(ctx, "grant question")
	return err
}
