package faults

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// h builds a client's history from a compact script, one op per string:
//
//	"add 3 ok note 2 saved"         an add of note 3, answered "note 2 saved"
//	"add 3 ok note 1 saved |reset"  ... with a stateReset mark
//	"add 3 ok note 1 saved |notsaved"
//	"add 3 fail"                    a failed attempt, retried: -32053, nothing ran
//	"add 3 fail |reset"             ... whose error result says stateReset
//	"list fail"                     a failed read, retried
//	"add 3 noanswer"                a failed attempt, retried: no answer, it may have run
//	"add 3 502"                     a failed attempt, retried: the proxy's 502 (a replica died mid-call)
//	"add 3 giveup"                  a failed attempt (no answer), given up
//	"list 1 2"                      a read of notes n1 and n2 ("list" alone: none)
//	"list |reset 4"                 a read with a stateReset mark
//	"session"                       the session was lost
//	"renew"                         the client began a new session
//	"add@2 3 ok note 1 saved"       an add to a two-plugin client's plugin 2 (also list@N)
func h(script ...string) []Op {
	var ops []Op
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	attempt := 1
	for _, s := range script {
		at = at.Add(time.Second)
		op := Op{Client: 7, Era: Legacy, Start: at, End: at, Attempt: attempt, Final: true}
		body, marks, _ := strings.Cut(s, "|")
		f := strings.Fields(body)
		kind, plugin, _ := strings.Cut(f[0], "@")
		op.Kind = kind
		fmt.Sscan(plugin, &op.Plugin)
		switch op.Kind {
		case "add":
			fmt.Sscan(f[1], &op.Note)
			switch f[2] {
			case "ok":
				op.Text = strings.Join(f[3:], " ")
			case "fail":
				op.Err, op.Final = "JSON-RPC error -32053: state unavailable", false
			case "noanswer":
				op.Err, op.Final = "transport: connection closed", false
			case "502":
				op.Err, op.Final = describe(fmt.Errorf("%w: calling \"tools/call\": Bad Gateway", &jsonrpc.Error{Code: -32005, Message: "rejected by transport"})), false
			case "giveup":
				op.Err = "timeout"
			}
		case "list":
			if len(f) > 1 && f[1] == "fail" {
				op.Err, op.Final = "JSON-RPC error -32053: state unavailable", false
				f = f[:1]
			}
			var lines []string
			for i, n := range f[1:] {
				lines = append(lines, fmt.Sprintf("%d. c7-n%s", i+1, n))
			}
			op.Text = strings.Join(lines, "\n")
			if len(lines) == 0 {
				op.Text = "no notes"
			}
		case "session":
			op.Err = "session not found"
		case "renew":
		}
		for _, m := range strings.Fields(marks) {
			switch {
			case m == "reset":
				op.Reset = "store-lost"
			case m == "notsaved":
				op.NotSaved = "store-unavailable"
			default: // a list's notes after its mark
				lines := strings.Split(op.Text, "\n")
				if op.Text == "no notes" {
					lines = nil
				}
				lines = append(lines, fmt.Sprintf("%d. c7-n%s", len(lines)+1, m))
				op.Text = strings.Join(lines, "\n")
			}
		}
		if op.Final {
			attempt = 1
		} else {
			attempt++
		}
		ops = append(ops, op)
	}
	return ops
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		history []Op
		want    []string // "kind op", in order
	}{
		{"clean", h("add 1 ok note 1 saved", "list 1", "add 2 ok note 2 saved", "list 1 2"), nil},
		{"failed then retried once", h("add 1 fail", "add 1 ok note 1 saved", "list 1"), nil},
		{"acknowledged write lost", h("add 1 ok note 1 saved", "list 1", "add 2 ok note 2 saved", "list 1"),
			[]string{"lost list"}},
		{"silent reset", h("add 1 ok note 1 saved", "list 1", "add 2 ok note 1 saved", "list 2"),
			[]string{"count-fell add n2", "lost list"}},
		{"reset said so", h("add 1 ok note 1 saved", "list 1", "add 2 ok note 1 saved |reset", "list 2"), nil},
		{"reset said by a failure", h("add 1 ok note 1 saved", "list 1", "add 2 fail |reset", "add 2 ok note 1 saved", "list 2"), nil},
		{"reset said by a failed read", h("add 1 ok note 1 saved", "list 1", "list fail |reset", "add 2 ok note 1 saved", "list 2"), nil},
		{"reset on a read", h("add 1 ok note 1 saved", "list 1", "add 2 ok note 2 saved", "list |reset", "add 3 ok note 1 saved", "list 3"), nil},
		{"not saved, then gone", h("add 1 ok note 1 saved", "list 1", "add 2 ok note 2 saved |notsaved", "list 1", "add 3 ok note 2 saved", "list 1 3"), nil},
		{"not saved, then dropped by a saved add", h("add 1 ok note 1 saved", "list 1", "add 2 ok note 2 saved |notsaved", "add 3 ok note 2 saved", "list 1 3"), nil},
		{"not saved, then saved with it", h("add 1 ok note 1 saved", "list 1", "add 2 ok note 2 saved |notsaved", "add 3 ok note 3 saved", "list 1 3"),
			[]string{"lost list"}},
		{"applied twice by a retry", h("add 1 ok note 1 saved", "list 1", "add 2 fail", "add 2 ok note 3 saved", "list 1 2 2"),
			[]string{"applied-twice add n2", "applied-twice list"}},
		{"twice, reported once", h("add 1 ok note 1 saved", "add 2 fail", "add 2 ok note 3 saved", "list 1 2 2", "add 3 ok note 4 saved", "list 1 2 2 3"),
			[]string{"applied-twice add n2", "applied-twice list"}},
		{"given up", h("add 1 giveup", "list"), []string{"unrecovered add n1"}},
		{"given up, applied after all", h("add 1 giveup", "list 1", "add 2 ok note 2 saved", "list 1 2"), []string{"unrecovered add n1"}},
		{"phantom", h("add 1 ok note 1 saved", "list 1 5"), []string{"phantom list"}},
		{"out of order", h("add 1 ok note 1 saved", "add 2 ok note 2 saved", "list 2 1"), []string{"phantom list"}},
		{"rolled back and forth", h("add 1 ok note 1 saved |notsaved", "list", "add 2 ok note 1 saved", "list 1 2"), []string{"phantom list"}},
		{"session lost", h("add 1 ok note 1 saved", "list 1", "session", "add 2 ok note 1 saved", "list 2"), []string{"session-lost session"}},
		{"new session holds old notes", h("add 1 ok note 1 saved", "session", "add 2 ok note 2 saved", "list 1 2"),
			[]string{"session-lost session", "phantom list"}},
		{"new session of the client's", h("add 1 ok note 1 saved", "list 1", "renew", "add 2 ok note 1 saved", "list 2"), nil},
		{"new session of the client's holds old notes", h("add 1 ok note 1 saved", "renew", "add 2 ok note 2 saved", "list 1 2"),
			[]string{"applied-twice add n2", "phantom list"}},
		{"new session of the client's, old note leaks in", h("add 1 ok note 1 saved", "list 1", "renew", "list 1"),
			[]string{"phantom list"}},
		{"unreadable result", h("add 1 ok the session moved"), []string{"unexpected add n1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs, _ := Check(tt.history)
			var got []string
			for _, v := range vs {
				got = append(got, v.Kind+" "+v.Op)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("violations (-want +got):\n%s\n%v", diff, vs)
			}
		})
	}
}

// TestResets: in a scenario whose fault must cost nothing, every
// stateReset is reported, on an add and on a read, though Check forgives
// it.
func TestResets(t *testing.T) {
	history := h("add 1 ok note 1 saved", "list 1", "add 2 ok note 1 saved |reset", "list |reset 2", "add 3 ok note 2 saved")
	if vs, _ := Check(history); len(vs) != 0 {
		t.Fatalf("Check: %v; want none (the resets said so)", vs)
	}
	var got []string
	for _, v := range Resets(history) {
		got = append(got, v.Kind+" "+v.Op)
	}
	if diff := cmp.Diff([]string{"unwarranted-reset add n2", "unwarranted-reset list"}, got); diff != "" {
		t.Errorf("Resets (-want +got):\n%s", diff)
	}
	if vs := Resets(h("add 1 ok note 1 saved", "list 1")); len(vs) != 0 {
		t.Errorf("Resets of a history without one: %v", vs)
	}
}

func TestCheckStats(t *testing.T) {
	_, st := Check(h("add 1 fail", "add 1 fail", "add 1 ok note 1 saved |notsaved", "list 1", "add 2 ok note 1 saved |reset", "list 2"))
	want := Stats{Ops: 4, Attempts: 6, Failed: 2, Recovered: 1, FailedBy: map[string]int{"rpc": 2},
		Notices: map[string]int{"notSaved:store-unavailable": 1, "stateReset:store-lost": 1}}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

// keyless marks a history's operations as a keyless client's.
func keyless(ops []Op) []Op {
	for i := range ops {
		ops[i].Keyless = true
	}
	return ops
}

func kinds(vs []Violation) []string {
	var got []string
	for _, v := range vs {
		got = append(got, v.Kind+" "+v.Op)
	}
	return got
}

// TestCheckKeyless: a client without idempotency keys may see an add it
// retried after an attempt that may have run applied once per such
// attempt, and nothing else is forgiven it. Each history is checked as a
// keyless client's and as a client's with keys.
func TestCheckKeyless(t *testing.T) {
	tests := []struct {
		name          string
		script        []string
		keyless, keys []string // the violations of each, "kind op", in order
	}{
		{"retried after no answer, applied twice",
			[]string{"add 1 ok note 1 saved", "list 1", "add 2 noanswer", "add 2 ok note 3 saved", "list 1 2 2", "add 3 ok note 4 saved", "list 1 2 2 3"},
			nil, []string{"applied-twice add n2", "applied-twice list"}},
		{"retried after the proxy's 502, applied twice",
			[]string{"add 1 ok note 1 saved", "list 1", "add 2 502", "add 2 ok note 3 saved", "list 1 2 2"},
			nil, []string{"applied-twice add n2", "applied-twice list"}},
		{"a late copy after later notes",
			[]string{"add 1 ok note 1 saved", "add 2 noanswer", "add 2 ok note 2 saved", "list 1 2", "add 3 ok note 4 saved", "list 1 2 3 2"},
			nil, []string{"applied-twice add n3", "applied-twice list"}},
		{"given up, applied twice",
			[]string{"add 1 noanswer", "add 1 giveup", "list 1 1", "add 2 ok note 3 saved", "list 1 1 2"},
			[]string{"unrecovered add n1"}, []string{"unrecovered add n1", "applied-twice list"}},
		{"more copies than attempts",
			[]string{"add 1 ok note 1 saved", "add 2 noanswer", "add 2 ok note 4 saved", "list 1 2 2 2"},
			[]string{"applied-twice add n2", "applied-twice list"}, []string{"applied-twice add n2", "applied-twice list"}},
		{"answered at its first attempt, applied twice",
			[]string{"add 1 ok note 1 saved", "list 1", "add 2 ok note 3 saved", "list 1 2 2"},
			[]string{"applied-twice add n2", "applied-twice list"}, []string{"applied-twice add n2", "applied-twice list"}},
		{"retried after an error that says nothing ran, applied twice",
			[]string{"add 1 ok note 1 saved", "add 2 fail", "add 2 ok note 3 saved", "list 1 2 2"},
			[]string{"applied-twice add n2", "applied-twice list"}, []string{"applied-twice add n2", "applied-twice list"}},
		{"retried, acknowledged, lost",
			[]string{"add 1 ok note 1 saved", "list 1", "add 2 noanswer", "add 2 ok note 2 saved", "list 1"},
			[]string{"lost list"}, []string{"lost list"}},
		{"retried, count fell",
			[]string{"add 1 ok note 1 saved", "list 1", "add 2 noanswer", "add 2 ok note 1 saved", "list 2"},
			[]string{"count-fell add n2", "lost list"}, []string{"count-fell add n2", "lost list"}},
		{"a reset said again keeps a copy from before it",
			// A replica says a reset again until its next call saved
			// (durable's unsaidOf: at worst twice), over the state the
			// client went on from since the first: the fault suite's
			// kill9-mid-drain-calls (32 clients) read [n3 n3 n4] so.
			[]string{"add 1 ok note 1 saved", "list |reset 1", "add 2 noanswer", "add 2 ok note 3 saved", "list 1 2 2", "add 3 ok note 4 saved |reset", "list 1 2 2 3"},
			nil, []string{"applied-twice add n2", "applied-twice list"}},
		{"a copy read, then gone",
			[]string{"add 1 ok note 1 saved", "add 2 noanswer", "add 2 ok note 3 saved", "list 1 2 2", "add 3 ok note 3 saved"},
			[]string{"count-fell add n3"}, []string{"applied-twice add n2", "applied-twice list", "count-fell add n3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs, _ := Check(keyless(h(tt.script...)))
			if diff := cmp.Diff(tt.keyless, kinds(vs)); diff != "" {
				t.Errorf("keyless: violations (-want +got):\n%s\n%v", diff, vs)
			}
			vs, _ = Check(h(tt.script...))
			if diff := cmp.Diff(tt.keys, kinds(vs)); diff != "" {
				t.Errorf("with keys: violations (-want +got):\n%s\n%v", diff, vs)
			}
		})
	}
	t.Run("what was allowed is counted", func(t *testing.T) {
		_, st := Check(keyless(h("add 1 noanswer", "add 1 ok note 2 saved", "list 1 1", "add 2 ok note 3 saved", "list 1 1 2")))
		if st.Notices[KeylessTwice] != 1 {
			t.Errorf("notices %v: want %s×1 (one note, read twice with its copy)", st.Notices, KeylessTwice)
		}
	})
	t.Run("a reset is still unwarranted", func(t *testing.T) {
		got := kinds(Resets(keyless(h("add 1 ok note 1 saved", "add 2 noanswer", "add 2 ok note 1 saved |reset"))))
		if diff := cmp.Diff([]string{"unwarranted-reset add n2"}, got); diff != "" {
			t.Errorf("Resets (-want +got):\n%s", diff)
		}
	})
}

// TestCheckTwoPlugins: a client of two plugins in one session holds a
// state in each, checked on its own; a session lost or renewed empties
// both.
func TestCheckTwoPlugins(t *testing.T) {
	tests := []struct {
		name    string
		history []Op
		want    []string
	}{
		{"each its own notes", h("add@1 1 ok note 1 saved", "list@1 1", "add@2 2 ok note 1 saved", "list@2 2",
			"add@1 3 ok note 2 saved", "list@1 1 3", "add@2 4 ok note 2 saved", "list@2 2 4"), nil},
		{"a takeover restored one of them", h("add@1 1 ok note 1 saved", "list@1 1", "add@2 2 ok note 1 saved", "list@2 2",
			"add@1 3 ok note 2 saved", "list@1 1 3", "add@2 4 ok note 1 saved", "list@2 4"),
			[]string{"count-fell add n4 in plugin 2", "lost list in plugin 2"}},
		{"a reset said by one forgives only it", h("add@1 1 ok note 1 saved", "list@1 1", "add@2 2 ok note 1 saved", "list@2 2",
			"add@1 3 ok note 1 saved |reset", "list@1 3", "add@2 4 ok note 1 saved", "list@2 4"),
			[]string{"count-fell add n4 in plugin 2", "lost list in plugin 2"}},
		{"each says its own reset", h("add@1 1 ok note 1 saved", "list@1 1", "add@2 2 ok note 1 saved", "list@2 2",
			"add@1 3 ok note 1 saved |reset", "list@1 3", "add@2 4 ok note 1 saved |reset", "list@2 4"), nil},
		{"a note of one in the other's list", h("add@1 1 ok note 1 saved", "add@2 2 ok note 1 saved", "list@2 1 2"),
			[]string{"phantom list in plugin 2"}},
		{"a session lost empties both", h("add@1 1 ok note 1 saved", "add@2 2 ok note 1 saved", "session",
			"add@1 3 ok note 1 saved", "list@1 3", "add@2 4 ok note 1 saved", "list@2 4"),
			[]string{"session-lost session"}},
		{"a new session empties both", h("add@1 1 ok note 1 saved", "add@2 2 ok note 1 saved", "list@2 2", "renew",
			"add@1 3 ok note 1 saved", "list@1 3", "add@2 4 ok note 1 saved", "list@2 4"), nil},
		{"a new session holds the other plugin's old note", h("add@1 1 ok note 1 saved", "add@2 2 ok note 1 saved", "renew",
			"add@1 3 ok note 1 saved", "add@2 4 ok note 1 saved", "list@2 2 4"),
			[]string{"phantom list in plugin 2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs, _ := Check(tt.history)
			if diff := cmp.Diff(tt.want, kinds(vs)); diff != "" {
				t.Errorf("violations (-want +got):\n%s\n%v", diff, vs)
			}
		})
	}
}
