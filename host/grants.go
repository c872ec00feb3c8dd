package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/grantstore"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Run-time grants (issue 30): a plugin's request that the operator's
// ceiling allows but did not grant (a host in ask.hosts, a secret in
// ask.secrets) is put to the person using the client, in a question the
// host writes, through elicitation. The answer is remembered for the
// session when the person says so (allow for this session) and always when
// they deny, so that a plugin cannot nag.

// DefaultMaxGrantQuestions is how many grant questions one session may be
// asked, across its plugins, when Options.MaxGrantQuestions is 0. Past it,
// grants not already given are refused without asking: a plugin cannot ask
// faster than a person can be expected to read.
const DefaultMaxGrantQuestions = 10

// maxGrantSessions is the default of Options.MaxGrantSessions: the
// sessions whose answers are kept, each tenant's a quarter of them (with
// Options.Tenants); past them the oldest answers of the tenant holding the
// most are forgotten (that session is asked again, within its cap
// afresh), so that one tenant's sessions never push out another's
// (tenantFIFO). Answers go when their client ends in the session layer
// (Host.clientEnded).
const maxGrantSessions = 4096

// grantSecret is the kind of a keyring secret asked for (the sandbox asks
// for network grants; the host serves secrets itself).
const grantSecret sandbox.GrantKind = "secret"

// The choices of a grant question, in the order a client shows them.
const (
	choiceOnce    = "allow once"
	choiceSession = "allow for this session"
	choiceAlways  = "always allow"
	choiceDeny    = "deny"
)

// localSubject is the subject of a stdio (or in-memory) session in the
// grant file: the person running the process.
const localSubject = "local"

// MetaGrant is the _meta key under which a grant question (an
// elicitation the host writes) says what it asks for, for a client that
// shows it its own way: {"plugin", "sha256", "kind", "target"}. The
// choices are the enum of the form's one property, "decision".
const MetaGrant = MetaPrefix + "grant"

// grantInputKey is the input request key of a grant question to a
// 2026-07-28 client.
const grantInputKey = "wasmtools.grant"

// grantKey is one grant of one plugin version: a session's answer is for
// the plugin (name and sha256) it was asked about.
type grantKey struct {
	plugin, sha256 string
	kind           sandbox.GrantKind
	target         string
}

// sessionGrants is one session's answers and counts.
type sessionGrants struct {
	label   string
	answers map[grantKey]bool // true: allowed for the session; false: denied
	// client is the number of the session-layer client of the key they
	// are of (sessions.Manager.ClientNumber), 0 for none yet (then its
	// first client's: session): a key's client
	// that ended and came back is another, and its old client's late
	// end must not forget the new one's answers.
	client uint64
	GrantCounts
}

// GrantCounts are a session's grant questions and their outcomes, as
// /status shows them.
type GrantCounts struct {
	// Asked counts questions put to the person; Given and Refused count
	// grants given and refused, whether asked or remembered.
	Asked   int `json:"asked"`
	Given   int `json:"given"`
	Refused int `json:"refused"`
}

// SessionGrants is one session's counts in [Host.GrantStatus].
type SessionGrants struct {
	Session string `json:"session"`
	GrantCounts
}

// grantBook holds every session's answers. It is the one owner of them;
// others ask it. Safe for concurrent use.
type grantBook struct {
	mu       sync.Mutex
	sessions map[sessions.Key]*sessionGrants
	// ended holds, for a key that came back as a later client while a
	// call of its ended client still runs, that client's entry: kept
	// apart from the later client's, and its question cap still held,
	// until the ended client's end (which waits for its calls).
	ended map[sessions.Key]*sessionGrants
	bound tenantFIFO[sessions.Key]
	max   int // Options.MaxGrantSessions, set before use
	// onChange, if set, is called (without b.mu) after a session's
	// answers or question count change: the durable layer's hook to
	// write export(key) into the session's record. Set before serving.
	onChange func(ctx context.Context, key sessions.Key)
	// clientOf, if set, numbers key's live client
	// (sessions.Manager.ClientNumber); nil numbers none. Set before
	// serving. It takes the manager's lock under b.mu: the session
	// layer calls the book (end) without its own.
	clientOf func(key sessions.Key) uint64
}

// clientNumber is the number of key's live client, 0 for none.
func (b *grantBook) clientNumber(key sessions.Key) uint64 {
	if b.clientOf == nil {
		return 0
	}
	return b.clientOf(key)
}

// changed reports a change of key's answers to onChange.
func (b *grantBook) changed(ctx context.Context, key sessions.Key) {
	if b.onChange != nil {
		b.onChange(ctx, key)
	}
}

// session returns key's entry for its live client (sessionOf).
func (b *grantBook) session(key sessions.Key, tenant string) *sessionGrants {
	return b.sessionOf(key, tenant, b.clientNumber(key))
}

// sessionOf returns key's entry for its client numbered client, made on
// first use, counted as tenant's ("" when not known: an entry keeps the
// tenant it has). For a client that ended, whose call still runs once
// the key came back as a later client, it is an entry kept nowhere: the
// later client's is not its. The caller holds b.mu.
func (b *grantBook) sessionOf(key sessions.Key, tenant string, client uint64) *sessionGrants {
	if b.sessions == nil {
		b.sessions = map[sessions.Key]*sessionGrants{}
		total := b.max
		if total <= 0 {
			total = maxGrantSessions
		}
		b.bound.total, b.bound.perTenant = total, max(total/4, 1)
	}
	for _, k := range b.bound.add(key, tenant) {
		delete(b.sessions, k)
		delete(b.ended, k)
	}
	s := b.sessions[key]
	older := s != nil && client != 0 && s.client > client
	if s != nil && s.client == 0 && client != 0 {
		// Kept while the key had no client (its calls so far of
		// stateless plugins, on pooled instances): the session's, and
		// so its live client's (TestClientlessAnswersKeptByFirstClient),
		// not an ended client's late call's
		// (TestClientlessAnswersGoToLiveClientNotOldOnesCall).
		older = client < b.clientNumber(key)
		if !older {
			s.client = client
		}
	}
	switch {
	case older:
		o := b.ended[key]
		if o == nil || o.client != client {
			o = &sessionGrants{label: key.String(), answers: map[grantKey]bool{}, client: client}
			b.keepEnded(key, o)
		}
		return o
	case s == nil || s.client != 0 && s.client < client:
		// None, or an ended client's whose end has not come yet (it
		// waits for that client's calls): the key's client now starts
		// afresh, as it would after that end. The ended client's is
		// kept apart for its calls still running
		// (TestOldClientsCallKeepsItsAnswersOnceTheKeyCameBack).
		if s != nil {
			b.keepEnded(key, s)
		}
		s = &sessionGrants{label: key.String(), answers: map[grantKey]bool{}, client: client}
		b.sessions[key] = s
	}
	return s
}

// keepEnded keeps s as key's ended client's entry, one per key: end
// and the key's eviction remove it. The caller holds b.mu.
func (b *grantBook) keepEnded(key sessions.Key, s *sessionGrants) {
	if b.ended == nil {
		b.ended = map[sessions.Key]*sessionGrants{}
	}
	b.ended[key] = s
}

// end forgets key's answers: its client numbered client ended. The
// answers of a later client of the key stay.
func (b *grantBook) end(key sessions.Key, client uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if o := b.ended[key]; o != nil && o.client <= client {
		delete(b.ended, key)
	}
	if s := b.sessions[key]; s != nil && s.client > client {
		return
	}
	delete(b.sessions, key)
	b.bound.remove(key)
}

// GrantStatus returns the grant counts of the sessions that were asked
// for or gave grants, sorted by session.
func (h *Host) GrantStatus() []SessionGrants {
	h.grants.mu.Lock()
	defer h.grants.mu.Unlock()
	out := []SessionGrants{}
	for _, s := range h.grants.sessions {
		out = append(out, SessionGrants{Session: s.label, GrantCounts: s.GrantCounts})
	}
	slices.SortFunc(out, func(a, b SessionGrants) int { return strings.Compare(a.Session, b.Session) })
	return out
}

// SetMaxGrantQuestions replaces [Options.MaxGrantQuestions] when the
// configuration changes (0 meaning DefaultMaxGrantQuestions again): each
// question after it is counted against the new cap, with the questions a
// session was asked before. So a session at the old cap is asked again
// under a higher one, and one past a lower cap is asked no more. Safe for
// concurrent use.
func (h *Host) SetMaxGrantQuestions(n int) {
	h.grantCap.Store(int64(max(n, 0)) + 1) // 0: never set
}

func (h *Host) maxGrantQuestions() int {
	n := h.opts.MaxGrantQuestions
	if set := h.grantCap.Load(); set > 0 {
		n = int(set - 1)
	}
	if n > 0 {
		return n
	}
	return DefaultMaxGrantQuestions
}

// AskGrant serves the sandbox's request for a grant inside the ceiling
// (a [sandbox.Asker]), and the host's own for a secret: it answers from
// what the session's person said before, or asks them, or refuses. The
// error's text is what the guest sees.
func (e *callEnv) AskGrant(ctx context.Context, r sandbox.GrantRequest) error {
	h, p := e.h, e.plugin
	what := grantWhat(r)
	if e.tool == nil {
		return fmt.Errorf("%s is not granted to this plugin: grants are asked for during tool calls only", what)
	}
	gk := grantKey{plugin: p.Name(), sha256: p.SHA256(), kind: r.Kind, target: r.Target}
	if r.Kind == sandbox.GrantFile {
		gk.target += " " + r.Mode
	}
	key, tenant, client := e.ref.key, e.tenant(), e.client()
	b := &h.grants
	b.mu.Lock()
	s := b.sessionOf(key, tenant, client)
	allowed, known := s.answers[gk]
	if other, ok := s.answers[otherMode(gk, r)]; !known && ok && other == (r.Mode == sandbox.ModeRead) {
		// Reading and changing allowed covers reading; reading denied
		// denies changing.
		allowed, known = other, true
	}
	if known {
		if allowed {
			s.Given++
		} else {
			s.Refused++
		}
	}
	b.mu.Unlock()
	switch {
	case known && allowed:
		h.auditGrant(e, r, "given", "remembered")
		return nil
	case known:
		h.auditGrant(e, r, "refused", "remembered")
		return fmt.Errorf("%s was denied earlier in this session by the person using the client", what)
	}
	subject := e.grantSubject()
	fk := grantstore.Key{Subject: subject, Plugin: gk.plugin, SHA256: gk.sha256, Kind: string(gk.kind), Target: gk.target}
	if subject != "" {
		allowed, known, err := h.opts.GrantFile.Lookup(fk)
		if !known && err == nil && r.Kind == sandbox.GrantFile {
			ok := fk
			ok.Target = otherMode(gk, r).target
			if other, otherKnown, oerr := h.opts.GrantFile.Lookup(ok); otherKnown && other == (r.Mode == sandbox.ModeRead) {
				allowed, known, err = other, true, oerr
			}
		}
		if err != nil {
			h.log.Error("grant file", "error", err) // then asked as though it had nothing
		}
		if known { // read each time: a revocation holds at once
			b.mu.Lock()
			s = b.sessionOf(key, tenant, client)
			if allowed {
				s.Given++
			} else {
				s.Refused++
			}
			b.mu.Unlock()
			if allowed {
				h.auditGrant(e, r, "given", "always")
				return nil
			}
			h.auditGrant(e, r, "refused", "always")
			return fmt.Errorf("%s was denied by the person using the client, who said to remember it", what)
		}
	}
	refuse := func(how, msg string) error {
		b.mu.Lock()
		b.sessionOf(key, tenant, client).Refused++
		b.mu.Unlock()
		h.auditGrant(e, r, "refused", how)
		return errors.New(msg)
	}
	if r.Redirect {
		return refuse("redirect", fmt.Sprintf("%s is not granted to this plugin: the person using the client may approve it, but not for a redirect: request it directly", what))
	}
	if why := e.cannotAsk(); why != "" {
		return refuse("cannot-ask", fmt.Sprintf("%s is not granted to this plugin; the operator allows it to be approved at run time, but %s: a client that supports elicitation could approve it", what, why))
	}
	b.mu.Lock()
	s = b.sessionOf(key, tenant, client)
	over := s.Asked >= h.maxGrantQuestions()
	if !over {
		s.Asked++
	}
	b.mu.Unlock()
	if over {
		return refuse("cap", fmt.Sprintf("%s is not granted to this plugin, and this session was asked the most grant questions it may be (%d)", what, h.maxGrantQuestions()))
	}
	b.changed(ctx, key)
	h.auditGrant(e, r, "asked", "")
	params, schema := grantQuestion(p.Name(), p.SHA256(), r, e.grantReason(), subject != "")
	q := &question{key: grantInputKey, params: params, schema: schema, answer: make(chan *abi.ElicitResult, 1)}
	a, ok := ask(ctx, e, q, q.answer)
	if !ok {
		return refuse("cancelled", fmt.Sprintf("%s is not granted to this plugin: the call ended before the person answered", what))
	}
	if a.Error != "" && q.put.Load() {
		// Put to the client, which then failed it, or no one answered
		// in time: asked all the same, or a plugin would ask without end
		// a person whose client answers with errors (a red team, stop 66).
		return refuse("failed", fmt.Sprintf("%s is not granted to this plugin: the question got no answer (%s)", what, a.Error))
	}
	if a.Error != "" { // the host did not ask after all
		// Not put to the person: the cap counts only questions asked
		// (a red team, stop 64: a plugin spent the session's cap, which
		// all its plugins share, with questions refused unasked).
		b.mu.Lock()
		if s = b.sessionOf(key, tenant, client); s.Asked > 0 {
			s.Asked--
		}
		b.mu.Unlock()
		return refuse("not-asked", fmt.Sprintf("%s is not granted to this plugin: the person could not be asked (%s)", what, a.Error))
	}
	decision, _ := a.Content["decision"].(string)
	switch {
	case a.Action == abi.ActionAccept && (decision == choiceOnce || decision == choiceSession || decision == choiceAlways && subject != ""):
		b.mu.Lock()
		s = b.sessionOf(key, tenant, client)
		s.Given++
		if decision == choiceSession {
			s.answers[gk] = true // "always" is in the file, which a revocation changes
		}
		b.mu.Unlock()
		how := map[string]string{choiceOnce: "once", choiceSession: "session", choiceAlways: "always"}[decision]
		if decision == choiceAlways {
			e.keepAnswer(fk, true)
		}
		if decision == choiceSession {
			b.changed(ctx, key)
		}
		h.auditGrant(e, r, "given", how)
		return nil
	case a.Action == abi.ActionDecline || a.Action == abi.ActionAccept && decision == choiceDeny:
		b.mu.Lock()
		s = b.sessionOf(key, tenant, client)
		s.answers[gk] = false // for the session, even if the file's is revoked
		s.Refused++
		b.mu.Unlock()
		if subject != "" {
			e.keepAnswer(fk, false)
		}
		b.changed(ctx, key)
		h.auditGrant(e, r, "refused", "denied")
		return fmt.Errorf("%s was denied by the person using the client", what)
	default: // cancel, or an answer that is none of the choices
		return refuse("dismissed", fmt.Sprintf("%s is not granted to this plugin: the person dismissed the question", what))
	}
}

// grantSubject is whom answers are kept for in the grant file: "" when
// there is no file, or the session has no subject to keep them for. An
// HTTP subject named "local" has none: the file's "local" is the person
// at stdio sessions, whose answers such a tenant was served.
func (e *callEnv) grantSubject() string {
	if e.h.opts.GrantFile == nil {
		return ""
	}
	_, req := e.current()
	if req.Extra == nil { // stdio, in-memory: the person running the process
		return localSubject
	}
	if s := subjectOf(req.Extra); s != localSubject {
		return s
	}
	return ""
}

// keepAnswer writes an answer to the grant file; a failure is logged (the
// session remembers it still).
func (e *callEnv) keepAnswer(k grantstore.Key, allowed bool) {
	if err := e.h.opts.GrantFile.Set(grantstore.Entry{Key: k, Allowed: allowed, Time: time.Now().UTC()}); err != nil {
		e.h.log.Error("grant file: answer not kept", "subject", k.Subject, "plugin", k.Plugin, "target", k.Target, "error", err)
	}
}

// otherMode is the key of the folder grant in the other mode (read for
// read-write, and the reverse); for other kinds, gk itself.
func otherMode(gk grantKey, r sandbox.GrantRequest) grantKey {
	if r.Kind != sandbox.GrantFile {
		return gk
	}
	mode := sandbox.ModeReadWrite
	if r.Mode == sandbox.ModeReadWrite {
		mode = sandbox.ModeRead
	}
	gk.target = r.Target + " " + mode
	return gk
}

// cannotAsk says why the call's client cannot be asked a grant question,
// or returns "".
func (e *callEnv) cannotAsk() string {
	if e.questions == nil {
		return "this call cannot ask questions"
	}
	_, req := e.current()
	var caps *mcp.ClientCapabilities
	if ip := req.Session.InitializeParams(); ip != nil {
		caps = ip.Capabilities
	}
	switch {
	case caps == nil || caps.Elicitation == nil:
		return "the client does not offer elicitation"
	case caps.Elicitation.Form == nil && caps.Elicitation.URL != nil:
		return `the client does not offer "form" elicitation`
	}
	return ""
}

// grantWhat names what a grant is for, in an error to the guest.
func grantWhat(r sandbox.GrantRequest) string {
	switch r.Kind {
	case sandbox.GrantNetwork:
		return "host " + r.Target
	case grantSecret:
		return fmt.Sprintf("secret %q", r.Target)
	case sandbox.GrantFile:
		return fmt.Sprintf("folder %s (%s)", r.Target, r.Mode)
	}
	return string(r.Kind) + " " + r.Target
}

// grantSchema is the form of a grant question: one choice, of "always
// allow" too when always is set.
func grantSchema(always bool) []byte {
	choices := []string{choiceOnce, choiceSession, choiceDeny}
	if always {
		choices = []string{choiceOnce, choiceSession, choiceAlways, choiceDeny}
	}
	b, _ := json.Marshal(map[string]any{
		"type":       "object",
		"properties": map[string]any{"decision": map[string]any{"type": "string", "title": "Decision", "enum": choices}},
		"required":   []string{"decision"},
	})
	return b
}

// grantQuestion writes the question for grant r of plugin name (sha256
// sum), and its form: the host's words, with the plugin's reason quoted as
// its own. always offers "always allow".
func grantQuestion(name, sum string, r sandbox.GrantRequest, reason string, always bool) (*mcp.ElicitParams, []byte) {
	var what string
	switch r.Kind {
	case sandbox.GrantNetwork:
		what = "to connect to " + r.Target
	case grantSecret:
		what = fmt.Sprintf("for the secret %q", r.Target)
	case sandbox.GrantFile:
		what = "to read the files in the folder " + r.Target
		if r.Mode == sandbox.ModeReadWrite {
			what = "to read and change the files in the folder " + r.Target
		}
	default:
		what = "for " + string(r.Kind) + " " + r.Target
	}
	msg := fmt.Sprintf("The plugin %q (sha256 %s) asks %s.\n", name, sum, what)
	if reason == "" {
		msg += "It gives no reason."
	} else {
		msg += fmt.Sprintf("It says why, in its own words: %q", reason)
	}
	if always {
		msg += "\nAllow it once, for this session, always, or deny it?"
	} else {
		msg += "\nAllow it once, for this session, or deny it?"
	}
	schemaJSON := grantSchema(always)
	var schema any
	json.Unmarshal(schemaJSON, &schema)
	grant := map[string]any{"plugin": name, "sha256": sum, "kind": string(r.Kind), "target": r.Target}
	if r.Mode != "" {
		grant["mode"] = r.Mode
	}
	meta := mcp.Meta{MetaGrant: grant}
	return &mcp.ElicitParams{Meta: meta, Mode: "form", Message: msg, RequestedSchema: schema}, schemaJSON
}

// setGrantReason serves grant_reason: the reason shown with this call's
// next grant questions, control characters removed and cut to
// abi.MaxGrantReason characters.
func (e *callEnv) setGrantReason(input []byte) error {
	var r abi.GrantReason
	if err := strictJSON(input, &r); err != nil {
		return err
	}
	e.mu.Lock()
	e.reason = cleanReason(r.Reason)
	e.mu.Unlock()
	return nil
}

func (e *callEnv) grantReason() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reason
}

// cleanReason keeps the printable characters of a guest's reason, spaces
// for any whitespace and ASCII apostrophes for quotation marks but the
// ASCII one, at most abi.MaxGrantReason of them.
func cleanReason(s string) string {
	var b strings.Builder
	n := 0
	for _, c := range s {
		switch {
		case n >= abi.MaxGrantReason:
			return strings.TrimSpace(b.String())
		case unicode.IsSpace(c):
			c = ' '
		case !unicode.IsPrint(c):
			continue
		case lookalikeQuote(c):
			c = '\''
		}
		b.WriteRune(c)
		n++
	}
	return strings.TrimSpace(b.String())
}

// lookalikeQuote reports whether c is a quotation mark, or a mark that
// looks like one (primes, ditto marks), other than the ASCII double
// quote, which %q escapes, and the apostrophe: the question quotes the
// reason between ASCII double quotes, and a look-alike closed them to the eye, putting the plugin's
// words after them as though the host wrote them (a red team, stop 66).
func lookalikeQuote(c rune) bool {
	if c == '"' || c == '\'' {
		return false
	}
	return unicode.Is(unicode.Quotation_Mark, c) || strings.ContainsRune("\u2033\u2036\u02ba\u02dd\u02ee\u3003\u05f4", c)
}

// grantEntry is a line of the record log for a grant asked for, given or
// refused.
type grantEntry struct {
	Time    time.Time  `json:"time"`
	Session string     `json:"session"`
	Plugin  string     `json:"plugin"`
	SHA256  string     `json:"sha256"`
	Tool    string     `json:"tool"`
	Grant   grantEvent `json:"grant"`
}

type grantEvent struct {
	Kind   sandbox.GrantKind `json:"kind"`
	Target string            `json:"target"`
	Mode   string            `json:"mode,omitempty"` // a folder's: read, read-write
	// Event is asked, given or refused; How says how it was decided
	// (once, session, denied, remembered, dismissed, cannot-ask, cap,
	// redirect, cancelled, not-asked, failed).
	Event string `json:"event"`
	How   string `json:"how,omitempty"`
}

// auditGrant logs a grant event, and appends it to the record log if
// there is one.
func (h *Host) auditGrant(e *callEnv, r sandbox.GrantRequest, event, how string) {
	p := e.plugin
	h.log.Info("grant "+event, "plugin", p.Name(), "session", e.sess, "kind", r.Kind, "target", r.Target, "how", how)
	if h.opts.RecordLog == nil {
		return
	}
	tool := ""
	if e.tool != nil {
		tool = e.tool.Name
	}
	h.writeRecordLog(grantEntry{
		Time: time.Now().UTC(), Session: e.sess, Plugin: p.Name(), SHA256: p.SHA256(), Tool: tool,
		Grant: grantEvent{Kind: r.Kind, Target: r.Target, Mode: r.Mode, Event: event, How: how},
	})
}

// grantRecord is a session's answers as its durable record keeps them
// (the "grants" field): so that a replica taking the session over asks
// neither again nor more than the cap allows.
type grantRecord struct {
	Asked   int                 `json:"asked"`
	Answers []grantRecordAnswer `json:"answers,omitempty"`
}

type grantRecordAnswer struct {
	Plugin  string            `json:"plugin"`
	SHA256  string            `json:"sha256"`
	Kind    sandbox.GrantKind `json:"kind"`
	Target  string            `json:"target"`
	Allowed bool              `json:"allowed"`
}

// export returns key's answers and question count as its durable record
// keeps them, nil when the session has none. For the durable layer: it
// writes them as the session record's "grants" field when they change
// (see onChange).
func (b *grantBook) export(key sessions.Key) []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sessions[key]
	if s == nil || s.client != 0 && s.client < b.clientNumber(key) {
		return nil // none, or an ended client's (session)
	}
	rec := grantRecord{Asked: s.Asked}
	for k, allowed := range s.answers {
		rec.Answers = append(rec.Answers, grantRecordAnswer{Plugin: k.plugin, SHA256: k.sha256, Kind: k.kind, Target: k.target, Allowed: allowed})
	}
	slices.SortFunc(rec.Answers, func(a, b grantRecordAnswer) int {
		return strings.Compare(a.Plugin+"\x00"+a.SHA256+"\x00"+string(a.Kind)+"\x00"+a.Target, b.Plugin+"\x00"+b.SHA256+"\x00"+string(b.Kind)+"\x00"+b.Target)
	})
	out, _ := json.Marshal(rec)
	return out
}

// restore gives key the answers of its durable record (export's bytes),
// replacing what this replica held: the record is the session's latest
// word. For the durable layer, when it adopts a session: ctx is the
// request's that takes it over, whose tenant (admitRun) the answers count
// as. Counted as no one's, they could be pushed out by any tenant's
// (tenantFIFO).
func (b *grantBook) restore(ctx context.Context, key sessions.Key, data []byte) error {
	var rec grantRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return fmt.Errorf("grants record: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	tenant, _ := ctx.Value(tenantKey{}).(string)
	s := b.session(key, tenant)
	s.Asked = max(s.Asked, rec.Asked)
	clear(s.answers)
	for _, a := range rec.Answers {
		s.answers[grantKey{plugin: a.Plugin, sha256: a.SHA256, kind: a.Kind, target: a.Target}] = a.Allowed
	}
	return nil
}
