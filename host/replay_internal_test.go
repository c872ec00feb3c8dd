package host

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type tenantCtx struct{}

func replayCtx(tenant string) context.Context {
	return context.WithValue(context.Background(), tenantCtx{}, tenant)
}

func newTestReplay(max int, tenants bool) *replayStore {
	return newReplayStore(max, tenants, func(ctx context.Context) string { s, _ := ctx.Value(tenantCtx{}).(string); return s })
}

// replayed is what After yields for index, joined, or its error.
func replayed(s *replayStore, session, stream string, index int) (string, error) {
	var out []string
	for d, err := range s.After(context.Background(), session, stream, index) {
		if err != nil {
			return "", err
		}
		out = append(out, string(d))
	}
	return strings.Join(out, ","), nil
}

// TestReplayStore: events replay from just after an index; past a tenant's
// share its own oldest go, not another's; past the total, the largest
// tenant's; a stream whose events all went is forgotten, and one that
// sends after that cannot be resumed; the standalone stream is kept;
// a session's end gives its bytes back.
func TestReplayStore(t *testing.T) {
	ev := func(c byte) []byte { return []byte(strings.Repeat(string(c), 100-eventOverhead)) } // costs 100
	s := newTestReplay(1000, true)                                                            // a share of 250: two events
	alice, bob := replayCtx("alice"), replayCtx("bob")
	s.Open(alice, "a", "")
	s.Open(alice, "a", "s1")
	s.Append(alice, "a", "s1", ev('x'))
	s.Append(alice, "a", "s1", ev('y'))
	if got, err := replayed(s, "a", "s1", 0); err != nil || got != string(ev('y')) {
		t.Fatalf("after 0: %q %v", got, err)
	}
	s.Open(bob, "b", "s2")
	for range 5 {
		s.Append(bob, "b", "s2", ev('b'))
	}
	if got, err := replayed(s, "a", "s1", -1); err != nil || got != string(ev('x'))+","+string(ev('y')) {
		t.Errorf("alice's stream after bob's five events: %q %v; want both of hers", got, err)
	}
	if _, err := replayed(s, "b", "s2", 0); !errors.Is(err, mcp.ErrEventsPurged) {
		t.Errorf("bob's purged events: %v, want ErrEventsPurged", err)
	}
	if got, err := replayed(s, "b", "s2", 2); err != nil || got != string(ev('b'))+","+string(ev('b')) {
		t.Errorf("bob's two newest: %q %v", got, err)
	}
	// Alice's third pushes out her first: s1 keeps y and z.
	s.Append(alice, "a", "s1", ev('z'))
	if got, err := replayed(s, "a", "s1", 0); err != nil || got != string(ev('y'))+","+string(ev('z')) {
		t.Errorf("alice's after her third: %q %v", got, err)
	}
	// A new stream of hers pushes out s1's two: s1 is forgotten, and
	// when it sends again it cannot be resumed from a wrong index.
	s.Open(alice, "a", "s3")
	s.Append(alice, "a", "s3", ev('1'))
	s.Append(alice, "a", "s3", ev('2'))
	if _, ok := s.sessions["a"].streams["s1"]; ok {
		t.Errorf("s1 kept with no events")
	}
	s.Append(alice, "a", "s1", ev('w'))
	if _, err := replayed(s, "a", "s1", 2); !errors.Is(err, mcp.ErrEventsPurged) {
		t.Errorf("s1 sending after it was forgotten: %v, want ErrEventsPurged", err)
	}
	// The standalone stream is never forgotten: its index goes on.
	s.Append(alice, "a", "", ev('g'))
	for range 3 {
		s.Append(alice, "a", "s3", ev('3'))
	}
	if _, ok := s.sessions["a"].streams[""]; !ok {
		t.Errorf("the standalone stream was forgotten")
	}
	if _, err := replayed(s, "a", "", -1); !errors.Is(err, mcp.ErrEventsPurged) {
		t.Errorf("the standalone stream's purged event: %v, want ErrEventsPurged", err)
	}
	s.SessionClosed(context.Background(), "a")
	s.SessionClosed(context.Background(), "b")
	if total, by := s.held(); total != 0 || len(by) != 0 || len(s.sessions) != 0 {
		t.Errorf("after both sessions ended: %d bytes, tenants %v, %d sessions", total, by, len(s.sessions))
	}
}

// TestReplayStoreTotal: past the total, the tenant holding the most loses
// its oldest, whoever appends.
func TestReplayStoreTotal(t *testing.T) {
	ev := []byte(strings.Repeat("e", 100-eventOverhead))
	s := newTestReplay(1000, false) // no tenants: one share of everything
	s.Open(replayCtx(""), "a", "s")
	for range 10 {
		s.Append(replayCtx(""), "a", "s", ev)
	}
	s.Append(replayCtx(""), "a", "s", ev)
	if total, _ := s.held(); total != 1000 {
		t.Errorf("%d bytes held, want 1000", total)
	}
	s = newTestReplay(400, true) // shares of 100: the total binds first with five tenants
	for i, name := range []string{"a", "b", "c", "d", "e"} {
		s.Open(replayCtx(name), name, "s")
		s.Append(replayCtx(name), name, "s", ev)
		if i == 0 {
			s.Append(replayCtx(name), name, "s", ev) // over its share: its first goes
		}
	}
	if total, by := s.held(); total != 400 || by["e"] != 100 {
		t.Errorf("five tenants at a total of 400: %d held, %v", total, by)
	}
}
