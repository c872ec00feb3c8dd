package host

import (
	"fmt"
	mathrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
)

// A session's standing GET stream (protocols 2025-11-25 up to
// 2026-07-28, which has no resumable streams) opens with a priming event
// of the host's own: the go-sdk's client (v1.8.0) ends the session once
// its standing stream ended more than MaxRetries (5) times, over the
// session's life, without an event whose ID differs from the last, and
// the go-sdk's server primes only POST streams. The priming event's ID
// is "~" + 16 hexadecimal digits drawn afresh for each stream + "_" + n,
// where n is one more than the index of the go-sdk event of the stream
// the client had reached (n = 0: none). The ID advances on every
// connection, and says where the client resumes: the host translates a
// Last-Event-ID of that form back to the go-sdk's ("_" + (n-1), or no
// header) before anything reads it (standingResume), so that the go-sdk
// replays what the client missed, from its own event store and indices
// (nothing is appended to the store behind its back). parseEventID of
// the go-sdk reads the form as a stream "~…" that never exists: a
// replica that does not translate it (an older version, in a rolling
// upgrade) finds nothing to replay there (canReplay) and answers with an
// empty stream, after which the client opens a new one. See
// docs/DESIGN.md, "The standing stream's priming event".

const (
	primePrefix   = "~"
	primeNonceLen = 16
	// primeMaxIndex bounds n: a go-sdk index past it is not ours.
	primeMaxIndex = 1<<31 - 1
)

// standingResume translates the Last-Event-ID eid of a GET: a priming
// event's ID of the host's form is replaced by the go-sdk's ID of the
// event it stands for ("" for none), anything else kept. standing says
// whether the GET is of the session's standing stream (no ID, one of
// the host's or the go-sdk's standalone stream's, "_k"), not a call's
// stream being resumed; ok is false for an ID of the host's form that it
// never gave (malformed).
func standingResume(eid string) (sdk string, standing, ok bool) {
	if eid == "" {
		return "", true, true
	}
	rest, ours := strings.CutPrefix(eid, primePrefix)
	if !ours {
		stream, _, _ := strings.Cut(eid, "_")
		return eid, stream == "", true
	}
	nonce, num, found := strings.Cut(rest, "_")
	if !found || len(nonce) != primeNonceLen || strings.Trim(nonce, "0123456789abcdef") != "" {
		return "", true, false
	}
	n, ok := primeIndex(num)
	if !ok {
		return "", true, false
	}
	if n == 0 {
		return "", true, true
	}
	return "_" + strconv.Itoa(n-1), true, true
}

// primeIndex parses n of a priming event's ID: decimal digits only, no
// sign, at most primeMaxIndex.
func primeIndex(s string) (int, bool) {
	if s == "" || len(s) > 10 || strings.Trim(s, "0123456789") != "" || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > primeMaxIndex {
		return 0, false
	}
	return n, true
}

// primeID is the ID of a priming event for a client that had reached
// the go-sdk event of the standing stream sdk ("_k"; "" none).
func primeID(sdk string) string {
	n := 0
	if _, k, ok := strings.Cut(sdk, "_"); ok {
		if i, err := strconv.Atoi(k); err == nil && i >= 0 && i < primeMaxIndex {
			n = i + 1
		}
	}
	return fmt.Sprintf("%s%016x_%d", primePrefix, mathrand.Uint64(), n)
}

// primes reports whether a GET of r's protocol gets a priming event:
// they came with 2025-11-25 (SEP-1699), whose clients read an event
// without data, and went with 2026-07-28 (SEP-2575).
func primes(r *http.Request) bool {
	v := r.Header.Get("Mcp-Protocol-Version")
	return v >= "2025-11-25" && v < sessionlessProtocol
}

// standingPrime is the priming event's ID for r, a GET whose
// Last-Event-ID was translated (standingResume), or "" when it gets
// none: a call's stream, or a protocol without priming events.
func standingPrime(r *http.Request) string {
	eid := r.Header.Get("Last-Event-ID")
	if !primes(r) || (eid != "" && !strings.HasPrefix(eid, "_")) {
		return ""
	}
	return primeID(eid)
}

// writePrime writes a priming event with ID id (nothing for "") and,
// when retry is set, asks the client to reconnect after retry
// milliseconds.
func writePrime(w http.ResponseWriter, id string, retry int64) {
	switch {
	case id != "" && retry > 0:
		fmt.Fprintf(w, "event: prime\nid: %s\nretry: %d\ndata: \n\n", id, retry)
	case id != "":
		fmt.Fprintf(w, "event: prime\nid: %s\ndata: \n\n", id)
	case retry > 0:
		fmt.Fprintf(w, "retry: %d\n\n", retry)
	}
	http.NewResponseController(w).Flush()
}

// primer passes the go-sdk's answer to a standing GET through, a
// priming event with ID id written right after the headers when the
// answer is the event stream (not a refusal).
type primer struct {
	http.ResponseWriter
	id      string
	written bool
}

func (p *primer) WriteHeader(code int) {
	if p.written {
		p.ResponseWriter.WriteHeader(code)
		return
	}
	p.written = true
	p.ResponseWriter.WriteHeader(code)
	if code == http.StatusOK && strings.HasPrefix(p.Header().Get("Content-Type"), "text/event-stream") {
		writePrime(p.ResponseWriter, p.id, 0)
	}
}

func (p *primer) Write(b []byte) (int, error) {
	if !p.written {
		p.WriteHeader(http.StatusOK)
	}
	return p.ResponseWriter.Write(b)
}

func (p *primer) Flush() {
	http.NewResponseController(p.ResponseWriter).Flush()
}

func (p *primer) Unwrap() http.ResponseWriter { return p.ResponseWriter }
