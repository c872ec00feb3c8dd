package faults

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The kinds of violation [Check] finds.
const (
	// Lost: writes the client was told succeeded (with no notSaved
	// mark) are missing from a read, and no stateReset said so (one
	// violation per read).
	Lost = "lost"
	// CountFell: an add's "note N saved" says earlier acknowledged notes
	// are gone, with no stateReset: a silent reset.
	CountFell = "count-fell"
	// Reset: a stateReset in a scenario whose fault loses nothing the
	// store held (a replica killed, stopped, drained or restarted; the
	// store down or frozen and back with its data): acknowledged state
	// given up, though said. [Check] forgives what a reset says was
	// lost; only a scenario whose fault loses the store's data may reset
	// ([Scenario.Resets]).
	Reset = "unwarranted-reset"
	// Twice: a note present twice in a read, or an add's count that
	// jumped past the notes the client had: applied twice. For a keyless
	// client (no idempotency key), an add retried after attempts that may
	// have run ([MayHaveRun]) may apply once for each of them and once
	// more: only more copies than that are a violation.
	Twice = "applied-twice"
	// Phantom: a read holds notes the client was never told were saved,
	// or saw gone before (a rollback undone), or out of order (one
	// violation per read).
	Phantom = "phantom"
	// Unrecovered: a failed call whose retries never succeeded.
	Unrecovered = "unrecovered"
	// SessionLost: the server ended a session the client was using (a
	// 2025-11-25 session 404 or its stream refused; a 2026-07-28 handle
	// refused): its state is gone without a stateReset.
	SessionLost = "session-lost"
	// Unexpected: a result the client cannot read (not "note N saved",
	// not a list).
	Unexpected = "unexpected"
	// Ready: a replica that must not be ready was (another state key), or
	// did not say why it is not.
	Ready = "ready"
)

// Kinds lists the violation kinds in the order reports show them.
var Kinds = []string{Lost, CountFell, Reset, Twice, Phantom, Unrecovered, SessionLost, Unexpected, Ready}

// Violation is one breach of the guarantees, with the client, era,
// operation and time.
type Violation struct {
	Kind   string
	Client int
	Era    string
	Op     string // "add n17", "list", ...
	At     time.Time
	Detail string
}

// Stats counts what a history holds besides violations.
type Stats struct {
	Ops       int            // operations (adds and lists) completed or given up
	Attempts  int            // attempts
	Failed    int            // failed attempts
	FailedBy  map[string]int // failed attempts by what the client was told (see [FailureKind])
	Recovered int            // operations that failed at first and then succeeded
	Notices   map[string]int // "stateReset:R" and "notSaved:R" marks seen, and KeylessTwice
}

// KeylessTwice is the [Stats.Notices] key counting what [Check] allowed a
// keyless client: notes a read showed more than once, as retries without
// an idempotency key may have applied them (each note once).
const KeylessTwice = "keyless-applied-twice"

// Resets returns a Reset violation for each stateReset mark in one
// client's history, for a scenario whose fault must cost no acknowledged
// state (a review, stop 57: Check forgives what a reset says was lost, so
// a reset the fault did not warrant went unreported).
func Resets(history []Op) []Violation {
	var out []Violation
	for _, op := range history {
		if op.Reset == "" {
			continue
		}
		out = append(out, Violation{Kind: Reset, Client: op.Client, Era: op.Era, Op: label(op), At: op.End,
			Detail: fmt.Sprintf("stateReset %q, but this fault loses nothing the store held", op.Reset)})
	}
	return out
}

// label names op in a violation: "add n17", "list", and for a two-plugin
// client the plugin ("add n17 in plugin 2").
func label(op Op) string {
	what := op.Kind
	if op.Kind == "add" {
		what = fmt.Sprintf("add n%d", op.Note)
	}
	if op.Plugin > 0 {
		what += fmt.Sprintf(" in plugin %d", op.Plugin)
	}
	return what
}

// entry is a note the checker expects in the client's state.
type entry struct {
	n       int
	durable bool      // acknowledged without notSaved (or read back since)
	maybe   bool      // its add was given up: it may or may not have applied
	acked   time.Time // when it was acknowledged
	copies  int       // how many times its add may have applied: 1, or for a keyless add 1 + its attempts that may have run
}

// plugState is what the checker knows of one plugin's state in the
// client's session.
type plugState struct {
	known   []entry
	synced  bool         // known is the state as last read (or empty, at start)
	sinceAt int          // notes numbered below this are from before a reset
	twice   map[int]bool // notes already reported present twice
	copied  map[int]bool // notes a read showed a keyless retry's copy of
	// copies is how many times each note's add may have applied, kept
	// across a stateReset: a reset may be said again over the state the
	// client went on from since the first (until its next call saved),
	// whose copies a read may still show.
	copies map[int]int
}

func newPlugState() *plugState {
	return &plugState{synced: true, twice: map[int]bool{}, copied: map[int]bool{}, copies: map[int]int{}}
}

// add appends e to what the client knows.
func (s *plugState) add(e entry) {
	s.known = append(s.known, e)
	s.copies[e.n] = max(s.copies[e.n], e.copies)
}

// slack is how many more notes than known the state may hold: copies a
// keyless client's retries may have added, that no read has shown yet.
func (s *plugState) slack() int {
	read := map[int]int{}
	for _, e := range s.known {
		read[e.n]++
	}
	extra := 0
	for _, e := range s.known {
		if read[e.n] > 0 {
			extra += max(0, e.copies-read[e.n])
			read[e.n] = 0
		}
	}
	return extra
}

var listLine = regexp.MustCompile(`^(\d+)\. c(\d+)-n(\d+)$`)

// Check reads one client's history, in order, and returns its violations
// and statistics. Its model: the client's state is the notes it was told
// were saved, in order. An add's "note N saved" must count exactly those
// (plus the new one); a read must hold every one acknowledged without a
// notSaved mark, each once, and no note the client did not write. A
// stateReset mark (on an add or a read) forgives what came before it: the
// next read is the new baseline. A session the client chose to begin
// (Kind "renew") starts empty: no earlier note may appear in it.
//
// A client of two plugins (Op.Plugin 1 and 2) holds a state in each, in
// one session: each is checked as above on its own, against its own adds
// and reads, so a takeover must restore both, and a write-back after the
// store lost a record must write both. A stateReset forgives only the
// plugin whose result carried it (the other's loss must be said on its
// own results); a note of one plugin read in the other's list is a
// phantom; a session lost or renewed empties both.
//
// A keyless client (Op.Keyless: no idempotency key) is held to the same
// rules but one: an add it retried after attempts that may have run
// ([MayHaveRun]: no answer, or an error result) may have applied once per
// such attempt besides the one answered, at any time since (a late attempt
// may run after later notes), so a read may hold a note that many times
// (its copies after the first in any place, unchecked for order), and an
// add's count may exceed the notes known by the copies no read has shown
// yet. Everything else holds as for a client with keys: a note
// acknowledged and missing from a read is lost, a count below the
// acknowledged notes (copies a read showed included) fell, an add
// answered at its first attempt, or retried only after errors that say
// nothing ran, applies once, and a reset is reported by [Resets] where the
// fault does not warrant one.
func Check(history []Op) ([]Violation, Stats) {
	st := Stats{Notices: map[string]int{}, FailedBy: map[string]int{}}
	var out []Violation
	var (
		plugins    = map[int]*plugState{}
		failures   = 0 // failed attempts of the operation under way
		unanswered = 0 // those of them that may have applied (see [MayHaveRun])
	)
	state := func(p int) *plugState {
		if plugins[p] == nil {
			plugins[p] = newPlugState()
		}
		return plugins[p]
	}
	flag := func(kind string, op Op, format string, args ...any) {
		out = append(out, Violation{Kind: kind, Client: op.Client, Era: op.Era, Op: label(op), At: op.End, Detail: fmt.Sprintf(format, args...)})
	}
	for _, op := range history {
		if op.Kind == "renew" {
			// The client left its session for a new one: an empty state,
			// which nothing from before may reach.
			for _, s := range plugins {
				s.known, s.synced, s.sinceAt = nil, true, 0
				clear(s.copies)
			}
			continue
		}
		if op.Kind == "session" {
			flag(SessionLost, op, "session %s: %s", short(op.Session), op.Err)
			for _, s := range plugins {
				s.known, s.synced, s.sinceAt = nil, false, 0
				clear(s.copies)
			}
			continue
		}
		s := state(op.Plugin)
		st.Attempts++
		if !op.OK() {
			st.Failed++
			st.FailedBy[FailureKind(op.Err)]++
			failures++
			if MayHaveRun(op.Err) {
				unanswered++
			}
			if op.Reset != "" {
				// A failure that says the state was reset (a call whose
				// write met the store's loss of its record): what came
				// before is given up, as when a result says so.
				st.Notices["stateReset:"+op.Reset]++
				since := op.Note
				if op.Kind != "add" {
					since = 1
					for _, e := range s.known {
						since = max(since, e.n+1)
					}
				}
				s.known, s.synced, s.sinceAt = nil, false, since
			}
			if op.Final {
				// A keyless add given up may have applied once per
				// attempt that may have run.
				copies := 1
				if op.Keyless {
					copies = max(1, unanswered)
				}
				st.Ops++
				flag(Unrecovered, op, "gave up after %d attempts (%s); last: %s", op.Attempt, op.End.Sub(op.Start).Round(time.Millisecond), op.Err)
				if op.Kind == "add" {
					s.add(entry{n: op.Note, maybe: true, copies: copies})
				}
				failures, unanswered = 0, 0
			}
			continue
		}
		st.Ops++
		// A keyless add may have applied once for each of its attempts
		// that may have run, and this one.
		copies := 1
		if op.Keyless {
			copies = 1 + unanswered
		}
		if failures > 0 {
			st.Recovered++
			failures, unanswered = 0, 0
		}
		if op.Reset != "" {
			st.Notices["stateReset:"+op.Reset]++
		}
		if op.NotSaved != "" {
			st.Notices["notSaved:"+op.NotSaved]++
		}
		switch op.Kind {
		case "add":
			n, ok := savedNumber(op.Text)
			if !ok {
				flag(Unexpected, op, "result %q", op.Text)
				continue
			}
			// slack: the copies a keyless client's retries may have
			// added, of earlier notes and of this one (0 with keys).
			slack := 0
			if op.Reset != "" {
				s.known, s.synced, s.sinceAt = nil, false, op.Note
			} else if s.synced {
				durable, sure := 0, 0
				for _, e := range s.known {
					if e.durable {
						durable++
					}
					if !e.maybe {
						sure++
					}
				}
				if op.Keyless {
					slack = s.slack() + copies - 1
				}
				switch {
				case n > len(s.known)+1+slack:
					flag(Twice, op, "%q, but the client had %d notes (%d acknowledged): the count jumped", op.Text, sure, durable)
				case n < durable+1:
					flag(CountFell, op, "%q, but the client had %d acknowledged notes and no stateReset", op.Text, durable)
				}
			}
			if op.NotSaved == "" {
				// A saved add saves the state it counts: the earlier
				// notes become durable. Unless the count is short of
				// them: notes marked notSaved were dropped (their
				// session moved before they were saved, as the mark
				// warned), and are then neither owed nor phantoms, as
				// when a read shows them gone.
				// A keyless client's count may hold copies in
				// place of dropped notes: with slack, they may have been.
				dropped := s.synced && op.Reset == "" && n < len(s.known)+1+slack
				for i := range s.known {
					switch {
					case s.known[i].maybe:
					case dropped && !s.known[i].durable:
						s.known[i].maybe = true
					default:
						s.known[i].durable = true
					}
				}
			}
			s.add(entry{n: op.Note, durable: op.NotSaved == "", acked: op.End, copies: copies})
		case "list":
			notes, bad := parseList(op.Text, op.Client)
			if bad != "" {
				flag(Unexpected, op, "%s in %q", bad, op.Text)
				continue
			}
			allowed := s.copies // copies a read may hold, before a reset too
			if op.Reset != "" {
				s.known, s.synced, s.sinceAt = nil, false, maxNote(notes)+1
			}
			byNote := map[int]entry{}
			for _, e := range s.known {
				byNote[e.n] = e
			}
			seen := map[int]int{}
			last := 0
			var phantoms []string
			for _, n := range notes {
				seen[n]++
				switch {
				case seen[n] > 1 && op.Keyless && seen[n] <= allowed[n]:
					// A keyless retry's copy, in any place after the
					// first (a late attempt runs after later notes).
					if !s.copied[n] {
						st.Notices[KeylessTwice]++
					}
					s.copied[n] = true
					continue
				case seen[n] > 1:
					if !s.twice[n] {
						flag(Twice, op, "note n%d is in the list %d times: %s", n, seen[n], oneLine(op.Text))
					}
					s.twice[n] = true
				case n <= last:
					phantoms = append(phantoms, fmt.Sprintf("n%d (after n%d: out of order)", n, last))
				case !hasNote(byNote, n) && s.synced:
					phantoms = append(phantoms, fmt.Sprintf("n%d", n))
				case !hasNote(byNote, n) && n >= s.sinceAt && op.Reset == "":
					phantoms = append(phantoms, fmt.Sprintf("n%d (after a stateReset)", n))
				}
				last = max(last, n)
			}
			if len(phantoms) > 0 {
				flag(Phantom, op, "%d notes the client was not told were saved, or saw gone: %s; read %s", len(phantoms), strings.Join(phantoms, ", "), oneLine(op.Text))
			}
			var lost []string
			for _, e := range s.known {
				if e.durable && seen[e.n] == 0 {
					lost = append(lost, fmt.Sprintf("n%d (acknowledged at %s)", e.n, e.acked.Format("15:04:05.000")))
				}
			}
			if len(lost) > 0 {
				flag(Lost, op, "%d acknowledged notes missing with no stateReset: %s; read %s", len(lost), strings.Join(lost, ", "), oneLine(op.Text))
			}
			next := make([]entry, 0, len(notes))
			for _, n := range notes {
				e, ok := byNote[n]
				if !ok {
					e = entry{n: n, durable: true, copies: 1}
				}
				e.maybe = false
				next = append(next, e)
			}
			s.known, s.synced = next, true
		}
	}
	return out, st
}

// MayHaveRun says whether a failed attempt (what the client was told, as
// [FailureKind] classifies it) may have applied its call: it got no answer
// (a timeout, a transport error, an HTTP error such as the proxy's 502 for
// a replica that died mid-call; a 503 or 429 too, though they say nothing
// ran, since the go-sdk client does not tell them apart) or an error
// result (a checkpoint that failed: "its effect may or may not have been
// kept"). A JSON-RPC error of the server's (such as -32053: "Nothing ran")
// and a connection never made say it did not run.
func MayHaveRun(err string) bool {
	switch FailureKind(err) {
	case "rpc", "connect":
		return false
	}
	return true
}

// FailureKind classifies what a client was told of a failed attempt:
// "rpc" (a JSON-RPC error, such as -32053), "result" (an error result),
// "timeout" (the client gave up on the attempt), "connect" (no session
// could be opened), or "transport" (an HTTP error or a broken connection).
// The go-sdk client reports a POST that failed ("Post …: EOF", the proxy
// closing the connection of a replica that died mid-call) or was answered
// an HTTP 500, 502, 503, 504 or 429 without a JSON-RPC error in its body
// as JSON-RPC error -32005, "rejected by transport": that is "transport".
func FailureKind(err string) string {
	switch {
	case strings.HasPrefix(err, rejectedByTransport):
		return "transport"
	case strings.HasPrefix(err, "JSON-RPC error"):
		return "rpc"
	case strings.HasPrefix(err, "error result"):
		return "result"
	case strings.HasPrefix(err, "timeout"):
		return "timeout"
	case strings.HasPrefix(err, "connect") || strings.HasPrefix(err, "tools/list"):
		return "connect"
	}
	return "transport"
}

// parseList reads a list's text ("no notes", or "1. cC-nN" lines): the
// note numbers, in order; bad says what could not be read.
func parseList(s string, client int) (notes []int, bad string) {
	s = strings.TrimSpace(s)
	if s == "no notes" {
		return nil, ""
	}
	for i, line := range strings.Split(s, "\n") {
		m := listLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			return nil, fmt.Sprintf("line %q", line)
		}
		if pos, _ := strconv.Atoi(m[1]); pos != i+1 {
			return nil, fmt.Sprintf("line %q numbered %d", line, pos)
		}
		if c, _ := strconv.Atoi(m[2]); c != client {
			return nil, fmt.Sprintf("another client's note %q", line)
		}
		n, _ := strconv.Atoi(m[3])
		notes = append(notes, n)
	}
	return notes, ""
}

// hasNote says whether byNote holds n.
func hasNote(byNote map[int]entry, n int) bool {
	_, ok := byNote[n]
	return ok
}

func maxNote(notes []int) int {
	m := 0
	for _, n := range notes {
		m = max(m, n)
	}
	return m
}

// oneLine shortens a list for a report: its note numbers, the first
// three and the last eight when there are more.
func oneLine(s string) string {
	var ns []string
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if m := listLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			ns = append(ns, "n"+m[3])
		}
	}
	if len(ns) > 11 {
		ns = append(append(ns[:3:3], "…"), ns[len(ns)-8:]...)
	}
	return "[" + strings.Join(ns, " ") + "]"
}

func short(s string) string {
	if len(s) > 24 {
		return s[:24] + "…"
	}
	return s
}

// Counts counts violations by kind.
func Counts(vs []Violation) map[string]int {
	m := map[string]int{}
	for _, v := range vs {
		m[v.Kind]++
	}
	return m
}

// SortedNotices lists a notices map as "key×n", sorted.
func SortedNotices(m map[string]int) string {
	var s []string
	for k, n := range m {
		s = append(s, fmt.Sprintf("%s×%d", k, n))
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}
