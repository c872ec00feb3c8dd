package proxytest_test

import (
	"io"
	"strings"
	"testing"
)

// gone sends a session's GET of /gone (its replica hangs up on it, as one
// exiting) through s's proxy, and returns the status and who answered.
func (s *setup) gone(key string) (int, string) {
	s.t.Helper()
	resp, err := s.get("/gone", key)
	if err != nil {
		s.t.Fatalf("GET %s: %v", key, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(strings.TrimPrefix(string(body), "data: "))
}

// TestHAProxySessionStreamsFollowSessions: a session's GETs (the
// session_streams backend) go where its POSTs go (sessions) once its
// replica is down: the same hash over the same servers, and the same
// health (track). A GET elsewhere would take the session over from the
// replica its calls reach, and the two would take it from each other.
func TestHAProxySessionStreamsFollowSessions(t *testing.T) {
	s := start(t, proxies[0].start)
	s.replicas["s1"].unready.Store(true)
	s.haproxy.WaitDown("sessions/s1")
	s.haproxy.WaitDown("session_streams/s1")
	for _, k := range sessionKeys("s1") {
		if k[0] != "Mcp-Session-Id" {
			continue
		}
		post := s.mustPost(k[0], k[1])
		if code, got := s.gone(k[1]); code != 200 || got != post {
			t.Errorf("%s: POST answered by %s, GET %d by %q", k[1], post, code, got)
		}
	}
}

// TestStreamsReopenedAtAnExitingReplica is TestConfigs' stream reopened
// at an exiting replica for each of a replica's sessions, not one: its
// GET goes on once, never back to the replica that hung up, which is
// still up (HAProxy's retry by the hash may not skip it but for having
// just failed).
func TestStreamsReopenedAtAnExitingReplica(t *testing.T) {
	for _, p := range proxies {
		t.Run(p.name, func(t *testing.T) {
			s := start(t, p.start)
			for _, k := range sessionKeys("s1") {
				if k[0] != "Mcp-Session-Id" {
					continue
				}
				before := s.replicas["s1"].hits.Load()
				code, got := s.gone(k[1])
				if hits := s.replicas["s1"].hits.Load() - before; code != 200 || got == "s1" || hits != 1 {
					t.Errorf("%s: %d by %q, s1 met it %d times; want 200 by another, s1 once", k[1], code, got, hits)
				}
			}
		})
	}
}
