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
	// jumped past the notes the client had: applied twice.
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
	Notices   map[string]int // "stateReset:R" and "notSaved:R" marks seen
}

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
		what := op.Kind
		if op.Kind == "add" {
			what = fmt.Sprintf("add n%d", op.Note)
		}
		out = append(out, Violation{Kind: Reset, Client: op.Client, Era: op.Era, Op: what, At: op.End,
			Detail: fmt.Sprintf("stateReset %q, but this fault loses nothing the store held", op.Reset)})
	}
	return out
}

// entry is a note the checker expects in the client's state.
type entry struct {
	n       int
	durable bool      // acknowledged without notSaved (or read back since)
	maybe   bool      // its add was given up: it may or may not have applied
	acked   time.Time // when it was acknowledged
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
func Check(history []Op) ([]Violation, Stats) {
	st := Stats{Notices: map[string]int{}, FailedBy: map[string]int{}}
	var out []Violation
	var (
		known    []entry
		synced   = true           // known is the state as last read (or empty, at start)
		sinceAt  = 0              // notes numbered below this are from before a reset
		failures = 0              // failed attempts of the operation under way
		twice    = map[int]bool{} // notes already reported present twice
	)
	flag := func(kind string, op Op, format string, args ...any) {
		what := op.Kind
		if op.Kind == "add" {
			what = fmt.Sprintf("add n%d", op.Note)
		}
		out = append(out, Violation{Kind: kind, Client: op.Client, Era: op.Era, Op: what, At: op.End, Detail: fmt.Sprintf(format, args...)})
	}
	for _, op := range history {
		if op.Kind == "renew" {
			// The client left its session for a new one: an empty state,
			// which nothing from before may reach.
			known, synced, sinceAt = nil, true, 0
			continue
		}
		if op.Kind == "session" {
			flag(SessionLost, op, "session %s: %s", short(op.Session), op.Err)
			known, synced, sinceAt = nil, false, 0
			continue
		}
		st.Attempts++
		if !op.OK() {
			st.Failed++
			st.FailedBy[FailureKind(op.Err)]++
			failures++
			if op.Final {
				st.Ops++
				flag(Unrecovered, op, "gave up after %d attempts (%s); last: %s", op.Attempt, op.End.Sub(op.Start).Round(time.Millisecond), op.Err)
				if op.Kind == "add" {
					known = append(known, entry{n: op.Note, maybe: true})
				}
				failures = 0
			}
			continue
		}
		st.Ops++
		if failures > 0 {
			st.Recovered++
			failures = 0
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
			if op.Reset != "" {
				known, synced, sinceAt = nil, false, op.Note
			} else if synced {
				durable, sure := 0, 0
				for _, e := range known {
					if e.durable {
						durable++
					}
					if !e.maybe {
						sure++
					}
				}
				switch {
				case n > len(known)+1:
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
				dropped := synced && op.Reset == "" && n < len(known)+1
				for i := range known {
					switch {
					case known[i].maybe:
					case dropped && !known[i].durable:
						known[i].maybe = true
					default:
						known[i].durable = true
					}
				}
			}
			known = append(known, entry{n: op.Note, durable: op.NotSaved == "", acked: op.End})
		case "list":
			notes, bad := parseList(op.Text, op.Client)
			if bad != "" {
				flag(Unexpected, op, "%s in %q", bad, op.Text)
				continue
			}
			if op.Reset != "" {
				known, synced, sinceAt = nil, false, maxNote(notes)+1
			}
			byNote := map[int]entry{}
			for _, e := range known {
				byNote[e.n] = e
			}
			seen := map[int]bool{}
			last := 0
			var phantoms []string
			for _, n := range notes {
				switch {
				case seen[n]:
					if !twice[n] {
						flag(Twice, op, "note n%d is in the list twice: %s", n, oneLine(op.Text))
					}
					twice[n] = true
				case n <= last:
					phantoms = append(phantoms, fmt.Sprintf("n%d (after n%d: out of order)", n, last))
				case byNote[n] == (entry{}) && synced:
					phantoms = append(phantoms, fmt.Sprintf("n%d", n))
				case byNote[n] == (entry{}) && n >= sinceAt && op.Reset == "":
					phantoms = append(phantoms, fmt.Sprintf("n%d (after a stateReset)", n))
				}
				seen[n] = true
				last = max(last, n)
			}
			if len(phantoms) > 0 {
				flag(Phantom, op, "%d notes the client was not told were saved, or saw gone: %s; read %s", len(phantoms), strings.Join(phantoms, ", "), oneLine(op.Text))
			}
			var lost []string
			for _, e := range known {
				if e.durable && !seen[e.n] {
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
					e = entry{n: n, durable: true}
				}
				e.maybe = false
				next = append(next, e)
			}
			known, synced = next, true
		}
	}
	return out, st
}

// FailureKind classifies what a client was told of a failed attempt:
// "rpc" (a JSON-RPC error, such as -32053), "result" (an error result),
// "timeout" (the client gave up on the attempt), "connect" (no session
// could be opened), or "transport" (an HTTP error or a broken connection).
func FailureKind(err string) string {
	switch {
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
