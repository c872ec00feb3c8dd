package sessions

// Key names a client: whose instances a lease uses. Keys are comparable;
// two equal keys are one client. The zero Key is not valid.
type Key struct {
	kind  Kind
	id    string
	conn  any
	label string
}

// Kind says which constructor made a key.
type Kind uint8

// The kinds of keys, by constructor.
const (
	KindConn Kind = iota + 1
	KindClient
	KindHandle
)

// Kind returns the key's kind.
func (k Key) Kind() Kind { return k.kind }

// Conn is the key of a transport session (an MCP session over stdio, or a
// stateful HTTP session). conn identifies it for its lifetime and must be
// comparable (the host passes the session pointer: over stdio a session
// has no ID); id is its ID (what the state store knows it by), and label
// names it in logs: a stateful HTTP session's ID is a credential, so the
// host gives a digest of it. Its client lives until [Manager.End].
func Conn(conn any, id, label string) Key {
	return Key{kind: KindConn, id: id, conn: conn, label: label}
}

// Client is the key of a client recognised across requests that have no
// transport session (protocol 2026-07-28 over HTTP) by an operator-chosen
// header. The id says which, by its prefix ("header:", ...). A request
// with a Client key makes its client if there is none. Its client ends at
// [Manager.End], or once it has had no lease for [Options.IdleTimeout].
func Client(id string) Key { return Key{kind: KindClient, id: id, label: id} }

// Handle is the key of a server-minted session handle (protocol
// 2026-07-28): id is the handle's secret part, label names it in logs
// without giving it away. Unlike a [Client] key, a handle's client exists
// only from [Manager.Open] until it ends ([Manager.End], the idle timeout,
// or eviction past [Options.MaxHandles]); a lease for a handle with no
// client is refused with [ErrUnknownKey], never served by a fresh client.
func Handle(id, label string) Key { return Key{kind: KindHandle, id: id, label: label} }

// String names the key in logs and the record log.
func (k Key) String() string { return k.label }

// ID is the key's identity as given to its constructor: the id of a
// [Conn], [Client] or [Handle] key (a session's ID and a handle's id are
// secrets: log [Key.String] instead).
func (k Key) ID() string { return k.id }
