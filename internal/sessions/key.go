package sessions

// Key names a client: whose instances a lease uses. Keys are comparable;
// two equal keys are one client. The zero Key is not valid.
type Key struct {
	kind kind
	id   string
	conn any
}

type kind uint8

const (
	kindConn kind = iota + 1
	kindClient
)

// Conn is the key of a transport session (an MCP session over stdio, or a
// stateful HTTP session). conn identifies it for its lifetime and must be
// comparable (the host passes the session pointer: over stdio a session
// has no ID); label names it in logs. Its client lives until
// [Manager.End].
func Conn(conn any, label string) Key { return Key{kind: kindConn, id: label, conn: conn} }

// Client is the key of a client recognised across requests that have no
// transport session (protocol 2026-07-28 over HTTP): by an authenticated
// subject, an operator-chosen header or a server-minted handle. The id
// says which, by its prefix ("sub:", "header:", ...). Its client ends at
// [Manager.End], or once it has had no lease for [Options.IdleTimeout].
func Client(id string) Key { return Key{kind: kindClient, id: id} }

// String names the key in logs and the record log.
func (k Key) String() string { return k.id }
