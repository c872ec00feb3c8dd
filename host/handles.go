package host

// Session handles: per-client state for clients of protocol 2026-07-28,
// which has no protocol session. The specification's answer, followed
// here: state that spans tool calls travels in a handle that the server
// mints and the client (the model) passes back as an ordinary tool
// argument. See docs/DESIGN.md, "Session handles".
//
// A handle reads
//
//	[<replica>.]wt1.<id>.<subject>.<mac>
//
// replica is the minting replica's name ([Options.Replica]), first so that
// a proxy routes the handle with a prefix match, absent for one process;
// id is 128 random bits (base64url), the key of the client's instances in
// the session layer; subject is "-" or a keyed digest of the
// authenticated subject the handle is bound to; mac is an HMAC-SHA256 of
// the rest under a key derived from the state key, cut to 128 bits. A
// handle lives in the session layer from its minting until it is idle for
// the session timeout (or evicted past the handle bound): the signature
// says the server minted it, the session layer whether it still lives.

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/durable"
	"github.com/wasmtools/wasmtools/internal/jsonobj"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// The names a handle travels under.
const (
	// SessionArgument is the tool argument that carries a handle; the
	// tools of plugins that keep state declare it in the input schema they
	// serve to 2026-07-28 clients.
	SessionArgument = abi.SessionArgument
	// SessionHeader is its SEP-2243 header name: a client mirrors the
	// argument into the HTTP header Mcp-Param-Wasmtools-Session, which a
	// load balancer can route on and the server checks against the body.
	SessionHeader = abi.SessionHeader
	// MetaSession is the _meta key of the handle in a result, and in a
	// request (a prompt get, resource read or completion has no arguments
	// to carry it; a tool call may carry it there too). A request that has
	// the key, even empty, is from a client that handles handles itself:
	// its results carry no note for the model.
	MetaSession = MetaPrefix + "session"
)

// ErrHandle is matched (errors.Is) by the refusal of a handle: malformed,
// forged, bound to another subject, unknown or expired.
var ErrHandle = errors.New("session handle refused")

const handleVersion = "wt1"

// maxHandleLen bounds what a client may present as a handle (a minted one
// is 57 bytes, up to 90 with a replica name); anything longer is refused
// before it is parsed.
const maxHandleLen = 128

// handleMACs holds the two keys of handles, derived from the state key:
// one signs handles, the other digests subjects. Neither signs request
// states. Each is kept as keyed HMACs to reuse: a handle is checked at
// every call, and a fresh HMAC hashes its key's two pads again.
type handleMACs struct {
	sign, subject sync.Pool // of *macState, HMAC-SHA256 under each key
}

// macState is a keyed HMAC and its scratch space: the message's bytes and
// the sum, which a hash.Hash's Write and Sum would otherwise each take on
// the heap (their arguments escape through the interface), at every call.
type macState struct {
	h   hash.Hash
	in  []byte
	sum [sha256.Size]byte
}

func newHandleMACs(stateKey []byte) *handleMACs {
	derive := func(label string) []byte {
		m := hmac.New(sha256.New, stateKey)
		m.Write([]byte(label))
		return m.Sum(nil)
	}
	m := &handleMACs{}
	sign, subject := derive("wasmtools handle signing v1"), derive("wasmtools handle subject v1")
	m.sign.New = func() any { return &macState{h: hmac.New(sha256.New, sign)} }
	m.subject.New = func() any { return &macState{h: hmac.New(sha256.New, subject)} }
	return m
}

// macSum appends to dst the HMAC of msg by an HMAC of p.
func macSum(p *sync.Pool, dst []byte, msg string) []byte {
	m := p.Get().(*macState)
	m.h.Reset()
	// Bounded by what is signed: a handle's body (maxHandleLen) or a
	// subject.
	m.in = append(m.in[:0], msg...)
	m.h.Write(m.in)
	dst = append(dst, m.h.Sum(m.sum[:0])...)
	p.Put(m)
	return dst
}

var b64 = base64.RawURLEncoding

// The lengths of a handle's digests, cut from their HMACs.
const (
	subjectTagBytes = 8
	handleMACBytes  = 16
)

// subjectTag is the handle's field for subject: "-" for none.
func (h *Host) subjectTag(subject string) string {
	if subject == "" {
		return "-"
	}
	var buf [sha256.Size]byte
	return b64.EncodeToString(macSum(&h.macs.subject, buf[:0], subject)[:subjectTagBytes])
}

func (h *Host) handleMAC(body string) string {
	var buf [sha256.Size]byte
	return b64.EncodeToString(macSum(&h.macs.sign, buf[:0], body)[:handleMACBytes])
}

// macMatches reports, in constant time, whether tag is the base64url form
// of digest, as a minted handle has it.
func macMatches(tag string, digest []byte) bool {
	var enc [b64MaxLen]byte
	n := b64.EncodedLen(len(digest))
	b64.Encode(enc[:n], digest)
	return len(tag) == n && subtle.ConstantTimeCompare([]byte(tag), enc[:n]) == 1
}

// b64MaxLen is the length of the base64url form of a SHA-256 sum.
const b64MaxLen = (sha256.Size*8 + 5) / 6

// handleKey is the session-layer key of a handle's id. Its label, for logs
// and the record log, is a digest: the id is a capability.
func handleKey(id string) sessions.Key {
	sum := sha256.Sum256([]byte(id))
	// Built in place: one allocation, the label's string.
	const prefix = "handle-"
	var label [len(prefix) + 12]byte
	copy(label[:], prefix)
	hex.Encode(label[len(prefix):], sum[:6])
	return sessions.Handle(id, string(label[:]))
}

// mintHandle makes a new handle bound to subject ("" for none) and opens
// its client in the session layer.
func (h *Host) mintHandle(subject string) (string, sessions.Key, error) {
	var raw [16]byte
	rand.Read(raw[:])
	id := b64.EncodeToString(raw[:])
	body := h.replicaPrefix() + strings.Join([]string{handleVersion, id, h.subjectTag(subject)}, ".")
	key := handleKey(id)
	// Each subject's handles, and those of no subject, are a group with a
	// share of their own: past it, or past MaxHandles, a subject's new
	// handle ends one of its own idle handles, never another's.
	group := ""
	if h.opts.Tenants {
		group = h.tenantOf(subject)
	}
	if err := h.ses.OpenIn(key, group, h.handleShare()); err != nil {
		return "", sessions.Key{}, fmt.Errorf("no new session handle: %w", err)
	}
	return body + "." + h.handleMAC(body), key, nil
}

// handleShare is each subject's share of the open handles (and that of
// the clients without a subject, together): [Options.MaxHandlesPerSubject],
// by default a quarter of MaxHandles.
func (h *Host) handleShare() int {
	if !h.opts.Tenants {
		return 0
	}
	if h.opts.MaxHandlesPerSubject > 0 {
		return h.opts.MaxHandlesPerSubject
	}
	return max(cmp.Or(h.opts.MaxHandles, sessions.DefaultMaxHandles)/4, 1)
}

// checkHandle returns the key of handle as presented by subject. The
// session layer says later whether it is still open.
func (h *Host) checkHandle(handle, subject string) (sessions.Key, error) {
	notHandle := func() error {
		return fmt.Errorf("%w: it is not a wasmtools session handle (pass the value of an earlier result exactly)", ErrHandle)
	}
	if len(handle) > maxHandleLen {
		return sessions.Key{}, notHandle()
	}
	// [<replica>.]wt1.<id>.<subject>.<mac>: the body is all but the mac.
	dot := strings.LastIndexByte(handle, '.')
	if dot < 0 {
		return sessions.Key{}, notHandle()
	}
	body, mac := handle[:dot], handle[dot+1:]
	var f [5]string
	n := 0
	for rest := body; n < len(f); n++ {
		var ok bool
		if f[n], rest, ok = strings.Cut(rest, "."); !ok {
			n++
			break
		}
	}
	switch n {
	case 3: // minted by a server with no replica name
	case 4: // by replica f[0], which any replica sharing the state key accepts
		copy(f[:], f[1:4])
	default:
		return sessions.Key{}, notHandle()
	}
	if f[0] != handleVersion {
		return sessions.Key{}, notHandle()
	}
	var sum [sha256.Size]byte
	if !macMatches(mac, macSum(&h.macs.sign, sum[:0], body)[:handleMACBytes]) {
		return sessions.Key{}, fmt.Errorf("%w: it was not minted by this server, or was altered", ErrHandle)
	}
	if subject == "" {
		if f[2] != "-" {
			return sessions.Key{}, fmt.Errorf("%w: it belongs to another client", ErrHandle)
		}
	} else if !macMatches(f[2], macSum(&h.macs.subject, sum[:0], subject)[:subjectTagBytes]) {
		return sessions.Key{}, fmt.Errorf("%w: it belongs to another client", ErrHandle)
	}
	return handleKey(f[1]), nil
}

// clientRef is whose instances a request runs on, and what its result
// says of it.
type clientRef struct {
	key sessions.Key
	// handle is the request's session handle, to return in the result's
	// _meta; "" when the request is not keyed by a handle.
	handle string
	// note: the result carries the note that tells the model what handle
	// it was given and how to pass it back (a newly minted handle, for a
	// client that does not handle handles itself).
	note bool
	// refused is why the request's handle was refused; handle is then a
	// new one, offered in the result.
	refused error
	// subject is the authenticated subject the handle is bound to.
	subject string
	// minted: handle was minted for this request, and the client learns
	// it only from the request's result.
	minted bool
}

// sessionless reports whether a request came without a protocol session:
// protocol 2026-07-28 over HTTP. stdio and in-memory sessions (the process
// is the session) and stateful HTTP sessions (Mcp-Session-Id) key on the
// session.
func sessionless(ss *mcp.ServerSession, extra *mcp.RequestExtra) bool {
	return ss.ID() == "" && extra != nil && extra.Header != nil
}

// subjectOf is the request's authenticated subject, "" for none. A shared
// bearer token identifies no one (see [RequireToken]).
func subjectOf(extra *mcp.RequestExtra) string {
	if extra != nil && extra.TokenInfo != nil {
		return extra.TokenInfo.UserID
	}
	return ""
}

// toolClient says whose instances a call of p's tool runs on: for a
// sessionless request to a plugin that keeps state, the client of the
// handle the call carries (fromArgs, the session argument, or in its
// _meta), or of a handle minted for it.
func (h *Host) toolClient(req *mcp.CallToolRequest, p *plugins.Plugin, fromArgs string) (clientRef, error) {
	fromMeta, programmatic, err := metaHandle(req.Params.Meta)
	if err != nil {
		return clientRef{}, err
	}
	if fromArgs != "" && fromMeta != "" && fromArgs != fromMeta {
		return clientRef{}, fmt.Errorf("%w: the %s argument and _meta[%q] name different handles", ErrHandle, SessionArgument, MetaSession)
	}
	ss, extra := req.Session, req.Extra
	if !sessionless(ss, extra) {
		return clientRef{key: h.connKey(ss)}, nil
	}
	if k, ok, err := h.headerKey(extra); ok || err != nil {
		return clientRef{key: k}, err
	}
	if p.Stateless() && !p.Asks() {
		return clientRef{key: h.connKey(ss)}, nil
	}
	// A stateless plugin that may ask the person for grants gets a
	// handle too: the person's answers, a "deny" and the cap on
	// questions, are the session's, and a request of its own would
	// forget them with each call (a red team, stop 64: the plugin asked
	// at every call).
	return h.handleClient(subjectOf(extra), cmpOr(fromArgs, fromMeta), !programmatic)
}

// handleClient resolves a presented handle ("" for none): its key, or a
// newly minted handle, with the refusal of the one presented if any.
func (h *Host) handleClient(subject, presented string, note bool) (clientRef, error) {
	if presented != "" {
		key, err := h.checkHandle(presented, subject)
		if err == nil {
			return clientRef{key: key, handle: presented, subject: subject}, nil
		}
		ref, merr := h.mint(subject, note)
		ref.refused = err
		return ref, merr
	}
	return h.mint(subject, note)
}

func (h *Host) mint(subject string, note bool) (clientRef, error) {
	handle, key, err := h.mintHandle(subject)
	if err != nil {
		return clientRef{}, err
	}
	return clientRef{key: key, handle: handle, note: note, subject: subject, minted: true}, nil
}

// forgetUnseen ends the client of a handle minted for a call that was
// then refused (err, callTool's refusal): a refusal is a JSON-RPC error,
// with no result to carry the handle, so no client can name it again, and
// its instance (one may have started before a cancellation was seen)
// would sit idle until the session timeout, counted against MaxHandles.
func (h *Host) forgetUnseen(ref clientRef, err error) {
	if err != nil && ref.minted {
		h.ses.End(context.Background(), ref.key)
	}
}

// requestKey says whose instances a prompt get, resource read or
// completion runs on: for a sessionless request, the handle it carries in
// _meta or the Mcp-Param-Wasmtools-Session header (a request with neither
// runs on instances of its own, freed when it ends).
func (h *Host) requestKey(ss *mcp.ServerSession, extra *mcp.RequestExtra, meta mcp.Meta) (sessions.Key, error) {
	if !sessionless(ss, extra) {
		return h.connKey(ss), nil
	}
	if k, ok, err := h.headerKey(extra); ok || err != nil {
		return k, err
	}
	fromMeta, _, err := metaHandle(meta)
	if err != nil {
		return sessions.Key{}, err
	}
	fromHeader, ok := decodeParamHeader(extra.Header.Get("Mcp-Param-" + SessionHeader))
	if !ok {
		return sessions.Key{}, fmt.Errorf("%w: the Mcp-Param-%s header is not valid", ErrHandle, SessionHeader)
	}
	if fromMeta != "" && fromHeader != "" && fromMeta != fromHeader {
		return sessions.Key{}, fmt.Errorf("%w: _meta[%q] and the Mcp-Param-%s header name different handles", ErrHandle, MetaSession, SessionHeader)
	}
	handle := cmpOr(fromMeta, fromHeader)
	if handle == "" {
		return h.connKey(ss), nil
	}
	return h.checkHandle(handle, subjectOf(extra))
}

// handleElsewhere reports whether a sessionless request names, in its
// Mcp-Param-Wasmtools-Session header, a handle whose session this replica
// would refuse for want of the state store, and another replica may serve
// (durable.Keeper.ServeElsewhere). Cheap while the store answers.
func (h *Host) handleElsewhere(r *http.Request) bool {
	if !h.dur.StoreAway() {
		return false
	}
	handle, ok := decodeParamHeader(r.Header.Get("Mcp-Param-" + SessionHeader))
	if !ok || handle == "" {
		return false
	}
	key, err := h.checkHandle(handle, userOf(r))
	return err == nil && h.dur.ServeElsewhere(r.Context(), durable.StoreID(key))
}

// headerKey is the key of the operator's client header
// ([Options.ClientKeyHeader]), which takes precedence over handles. It is
// bound to the request's subject: another subject naming the same header
// value gets a client of its own, never the first one's instances. A
// value over maxClientHeaderLen is refused: each value is a client kept
// until the session timeout, its value with it.
func (h *Host) headerKey(extra *mcp.RequestExtra) (sessions.Key, bool, error) {
	if name := h.opts.ClientKeyHeader; name != "" {
		if v := extra.Header.Get(name); v != "" {
			if len(v) > maxClientHeaderLen {
				return sessions.Key{}, false, fmt.Errorf("the %s header is over %d bytes", name, maxClientHeaderLen)
			}
			// The tag has no ':' (base64url, or "-" for no subject).
			return sessions.Client("header:" + h.subjectTag(subjectOf(extra)) + ":" + v), true, nil
		}
	}
	return sessions.Key{}, false, nil
}

// maxClientHeaderLen bounds a client header value
// ([Options.ClientKeyHeader]): a user's name or a UUID fits many times.
const maxClientHeaderLen = 256

// splitSessionArgument separates the session argument from a call's
// arguments: rest is what the plugin's own schema and the guest get, the
// other members as the client wrote them, in its order. Arguments that do
// not name it are returned as they are; arguments that are not an object
// (or not JSON) are left to validation. A name may be written with
// escapes ("wasmtools\u005fsession"), which the go-sdk's header check
// decodes too; if the argument is named more than once, every member is
// taken out and the last is the handle, as a decoder keeps the last.
func splitSessionArgument(args json.RawMessage) (rest json.RawMessage, handle string, err error) {
	rest, raw, found := jsonobj.Cut(args, SessionArgument)
	switch {
	case !found:
		return args, "", nil
	case string(raw) == "null":
		return rest, "", nil
	case plainString(raw):
		return rest, string(raw[1 : len(raw)-1]), nil
	}
	// Decoded into a variable of its own: the decoder's pointer would
	// take the result itself to the heap, at every call.
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return rest, "", fmt.Errorf("%w: the %s argument must be a string", ErrHandle, SessionArgument)
	}
	return rest, s, nil
}

// plainString reports whether v, valid JSON, is a string of printable
// ASCII without escapes (a handle as minted): its text is its contents.
func plainString(v []byte) bool {
	if len(v) < 2 || v[0] != '"' {
		return false
	}
	for _, c := range v[1 : len(v)-1] {
		if c < 0x20 || c > 0x7e || c == '\\' {
			return false
		}
	}
	return true
}

// metaHandle reads the handle from a request's _meta; present reports
// whether the key is there at all (even empty: "mint me one").
func metaHandle(meta mcp.Meta) (handle string, present bool, err error) {
	v, ok := meta[MetaSession]
	if !ok {
		return "", false, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", true, fmt.Errorf("%w: _meta[%q] must be a string", ErrHandle, MetaSession)
	}
	return s, true, nil
}

// withoutHandle is a request's _meta as the guest gets it: without the
// session handle, a capability over the client's instances of every
// plugin, and without the keys of MCP 2026-07-28's per-request envelope
// (see hostOnlyMeta); nil if nothing else is in it.
func withoutHandle(meta mcp.Meta) mcp.Meta {
	drop := 0
	for _, k := range hostOnlyMeta {
		if _, ok := meta[k]; ok {
			drop++
		}
	}
	switch drop {
	case 0:
		return meta
	case len(meta):
		// A 2026-07-28 request's _meta is mostly just this: its
		// envelope and the handle. Nothing is left for the guest, and
		// nothing is copied.
		return nil
	}
	m := make(mcp.Meta, len(meta)-drop)
	for k, v := range meta {
		if !slices.Contains(hostOnlyMeta[:], k) {
			m[k] = v
		}
	}
	return m
}

// hostOnlyMeta are the _meta keys a guest never gets: the session handle,
// and the keys of MCP 2026-07-28's per-request envelope (the go-sdk's
// MetaKey*), in which a client says with every request what a 2025-11-25
// client says once, in initialize: its protocol version, name and
// capabilities, its log level. They are the protocol's, read by the go-sdk
// and the host; a v2 guest gets the protocol version in its call context.
// Leaving them out keeps a guest's input the same in both protocol eras,
// and spares each call their encoding and the guest their decoding (a
// quarter of the Go servlet's time on a 100-byte echo; docs/DESIGN.md).
var hostOnlyMeta = [...]string{MetaSession, mcp.MetaKeyProtocolVersion, mcp.MetaKeyClientInfo, mcp.MetaKeyClientCapabilities, mcp.MetaKeyLogLevel}

// decodeParamHeader decodes an Mcp-Param-* header value (SEP-2243: a
// value that is not plain ASCII comes as =?base64?…?=).
func decodeParamHeader(v string) (string, bool) {
	if !strings.HasPrefix(v, "=?base64?") || !strings.HasSuffix(v, "?=") {
		return v, true
	}
	b, err := base64.StdEncoding.DecodeString(v[len("=?base64?") : len(v)-2])
	return string(b), err == nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// handleNotes is what SetHandleNotes set.
type handleNotes struct {
	quiet   bool
	plugins map[string]bool
}

// SetHandleNotes replaces [Options.QuietHandles] and
// [Options.QuietPlugins] when the configuration changes: each result
// after it has the note, or not, as they say. Safe for concurrent use.
func (h *Host) SetHandleNotes(quiet bool, plugins map[string]bool) {
	h.notes.Store(&handleNotes{quiet: quiet, plugins: maps.Clone(plugins)})
}

// quiet reports whether plugin's results leave out the note for the
// model: its own setting, else the host's.
func (h *Host) quiet(plugin string) bool {
	n := handleNotes{quiet: h.opts.QuietHandles, plugins: h.opts.QuietPlugins}
	if p := h.notes.Load(); p != nil {
		n = *p
	}
	if q, ok := n.plugins[plugin]; ok {
		return q
	}
	return n.quiet
}

// sessionResult puts ref's handle in res: in _meta always, and for a
// minted handle the note the model can act on, as a block of its own
// after the plugin's content.
func (h *Host) sessionResult(ref clientRef, pluginName string, res *mcp.CallToolResult) {
	if ref.handle == "" {
		return
	}
	if res.Meta == nil {
		res.Meta = mcp.Meta{}
	}
	res.Meta[MetaSession] = ref.handle
	if ref.note && !h.quiet(pluginName) {
		res.Content = append(res.Content, &mcp.TextContent{Text: fmt.Sprintf(
			"[wasmtools: this tool keeps state between calls. To keep working with the same state, pass %q as the %s argument in your next calls of this server's tools.]",
			ref.handle, SessionArgument)})
	}
}

// refusedResult is the result of a call whose handle was refused: nothing
// ran, and a new handle is offered.
func (h *Host) refusedResult(ref clientRef) *mcp.CallToolResult {
	res := errorResult(fmt.Sprintf(
		"wasmtools: the session handle passed as %s was refused: %v. Nothing was run, and no state was changed. To start afresh, pass the new handle %q (its state is empty) as the %s argument.",
		SessionArgument, strings.TrimPrefix(ref.refused.Error(), ErrHandle.Error()+": "), ref.handle, SessionArgument))
	res.Meta = mcp.Meta{MetaSession: ref.handle}
	return res
}

// expiredResult is the result of a call whose handle the session layer no
// longer knows: unused past the session timeout, evicted, or from before
// a restart. A new handle is offered, never a silently fresh state.
func (h *Host) expiredResult(env *callEnv) (*mcp.CallToolResult, error) {
	ref, err := h.mint(env.ref.subject, false)
	if err != nil {
		return nil, fmt.Errorf("tool %q: %w", env.name, err)
	}
	ref.refused = fmt.Errorf("%w: it has expired or is unknown (a session ends after %s unused, and does not survive a restart), and its state is gone", ErrHandle, h.sessionTimeout())
	return h.refusedResult(ref), nil
}

// sessionProperty is the input schema property of the session argument.
var sessionProperty = json.RawMessage(`{"type":"string","x-mcp-header":"` + SessionHeader + `","description":"Session handle. Pass the value returned by an earlier call of this server's tools to keep working with the same state; omit it to start a new session."}`)

// withSessionArgument returns a tool's input schema with the session
// argument added to its properties. Only the top level and its properties
// are decoded, so the plugin's own keywords pass through byte for byte.
func withSessionArgument(schema json.RawMessage) (json.RawMessage, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(schema, &top); err != nil {
		return nil, err
	}
	props := map[string]json.RawMessage{}
	if raw, ok := top["properties"]; ok {
		if err := json.Unmarshal(raw, &props); err != nil {
			return nil, err
		}
	}
	props[SessionArgument] = sessionProperty
	b, err := json.Marshal(props)
	if err != nil {
		return nil, err
	}
	top["properties"] = b
	return json.Marshal(top)
}

// maxDerivedBody bounds the request body read to derive a missing
// session header; a larger body is passed on as it is.
const maxDerivedBody = 4 << 20

// deriveSessionHeader fills in the Mcp-Param-Wasmtools-Session header of a
// 2026-07-28 tools/call that carries the session argument but not the
// header, from the argument, before the transport checks the headers
// against the body (SEP-2243). A client that has not listed the tools
// again since a list_changed (the go-sdk client drops its tool cache
// then) no longer knows the session property's x-mcp-header, so it sends
// the handle without the header, and the transport would refuse the call
// with HTTP 400, which no client recovers from. The specification
// requires a server to refuse a header that disagrees with the body; one
// that is absent disagrees with nothing, and deriving it keeps that rule
// whole: a header that is present is never changed, so one that
// contradicts the argument is still refused. Proxies that route on the
// header see none for such a request and route it as a request without a
// handle (the state store still finds the session).
func deriveSessionHeader(r *http.Request) *http.Request {
	if r.Method != http.MethodPost || r.Header.Get("Mcp-Method") != "tools/call" || r.Header.Get("Mcp-Param-"+SessionHeader) != "" || r.Body == nil {
		return r
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxDerivedBody+1))
	body := io.MultiReader(bytes.NewReader(b), r.Body)
	r2 := r.Clone(r.Context())
	r2.Body = struct {
		io.Reader
		io.Closer
	}{body, r.Body}
	if err != nil || len(b) > maxDerivedBody {
		return r2
	}
	var msg struct {
		Params struct {
			Arguments map[string]json.RawMessage `json:"arguments"`
		} `json:"params"`
	}
	if json.Unmarshal(b, &msg) != nil {
		return r2
	}
	var handle string
	if raw, ok := msg.Params.Arguments[SessionArgument]; !ok || json.Unmarshal(raw, &handle) != nil || handle == "" {
		return r2
	}
	r2.Header.Set("Mcp-Param-"+SessionHeader, encodeParamHeader(handle))
	return r2
}

// encodeParamHeader encodes an Mcp-Param-* header value as SEP-2243 says:
// plain when it is printable ASCII without leading or trailing spaces,
// else =?base64?…?=.
func encodeParamHeader(v string) string {
	plain := v == strings.TrimSpace(v) && !strings.HasPrefix(v, "=?base64?")
	for i := 0; plain && i < len(v); i++ {
		plain = v[i] >= 0x20 && v[i] < 0x7f
	}
	if plain {
		return v
	}
	return "=?base64?" + base64.StdEncoding.EncodeToString([]byte(v)) + "?="
}
