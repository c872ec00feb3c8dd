package host_test

import (
	"crypto/rand"
	"io"
	"net/http"
	"testing"
)

// Another user's session is answered as an ID made up is, at the replica
// that holds it too: there the go-sdk found it and refused it, 403
// "session user mismatch", where any other replica (the store's record
// of another user) and an ID made up get 404, or 503 within a minute of
// the store's loss (TestStoreLostLatelyAnswersAlike). A GET resuming a
// stream gets what one of an ID made up does.
func TestOthersSessionAnsweredAsNone(t *testing.T) {
	rs, _ := redisReplicaSetWith(t, 0, nil)
	a := rs[0]
	logsOnFailure(t, rs[0], rs[1])
	alice := connectHTTP(t, a.srv.URL, "2025-11-25", tenantTransport{token: aliceToken})
	countWith(t, alice, "")
	made := "a." + rand.Text()
	type answer struct {
		code int
		body string
	}
	post := func(id string) answer {
		return answer{countStatus(t, a.srv.URL, id, bobToken), ""}
	}
	get := func(id, lastEventID string) answer {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, a.srv.URL+"/mcp", nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", id)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		req.Header.Set("Authorization", "Bearer "+bobToken)
		if lastEventID != "" {
			req.Header.Set("Last-Event-ID", lastEventID)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			return answer{res.StatusCode, string(b)}
		}
		return answer{res.StatusCode, ""} // an event stream: its IDs are drawn afresh
	}
	for _, c := range []struct {
		what string
		ask  func(id string) answer
	}{
		{"POST", post},
		{"GET", func(id string) answer { return get(id, "") }},
		{"GET resuming", func(id string) answer { return get(id, "_0") }},
	} {
		others, none := c.ask(alice.ID()), c.ask(made)
		if others != none {
			t.Errorf("%s at the holder, as bob: alice's session %d %q, an ID made up %d %q; want alike", c.what, others.code, others.body, none.code, none.body)
		}
	}
}
