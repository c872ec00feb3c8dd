package sessions_test

import (
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// An AnyPlugin seed stands for every plugin the client has no seed of its
// own for (what the durable keeper gives when the store lost a session's
// record and it cannot tell which plugins the session used elsewhere):
// each plugin's first instance says so, once; an instance kept under the
// same fence is not touched by it; a plugin's own seed comes first.
func TestAnyPluginSeedOncePerPlugin(t *testing.T) {
	w := newWorld(t, sessions.Options{})
	defer w.finish()
	for _, name := range []string{"a", "b", "c"} {
		w.version(name, false)
	}
	k := sessions.Client("c1")
	lost := sessions.Seed{Lost: "the store lost it", Reason: "store-lost"}
	if err := w.m.Seed(k, map[string]sessions.Seed{sessions.AnyPlugin: lost}, 1); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if got := w.reset(k, name, nil); got != "store-lost" {
			t.Errorf("%s's first lease: reset %q, want store-lost", name, got)
		}
		if got := w.reset(k, name, nil); got != "" {
			t.Errorf("%s's second lease: reset %q, want none (said once)", name, got)
		}
	}
	// Seeded again under the same fence: a's instance goes on, unsaid; c,
	// never started, says it; b's own seed comes before AnyPlugin's.
	if err := w.m.Seed(k, map[string]sessions.Seed{sessions.AnyPlugin: lost, "b": {Lost: "not saved", Reason: "not-saved"}}, 1); err != nil {
		t.Fatal(err)
	}
	if got := w.reset(k, "a", nil); got != "" {
		t.Errorf("a, kept under the same fence: reset %q, want none", got)
	}
	if got := w.reset(k, "b", nil); got != "" {
		t.Errorf("b, kept under the same fence: reset %q, want none", got)
	}
	if got := w.reset(k, "c", nil); got != "store-lost" {
		t.Errorf("c's first lease: reset %q, want store-lost", got)
	}
}

// A lease told to keep its notice (KeepNotice: its call may answer no
// one) leaves it for the next lease: the fault suite's sigstop-redis-empty
// found a request that sat in a stopped process take a fresh instance's
// one reset notice with it, and the client's next call go on unsaid.
func TestKeepNotice(t *testing.T) {
	w := newWorld(t, sessions.Options{})
	defer w.finish()
	k := sessions.Client("c1")
	if err := w.m.Seed(k, map[string]sessions.Seed{"counter": {Lost: "the store lost it", Reason: "store-lost"}}, 1); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"store-lost", "store-lost", ""} {
		var keep func(*sessions.Lease)
		if i == 0 {
			keep = (*sessions.Lease).KeepNotice
		}
		if got := w.reset(k, "counter", keep); got != want {
			t.Errorf("lease %d: reset %q, want %q", i+1, got, want)
		}
	}
}

// A plugin may be named "*" (a file "*.wasm"): its seed is its own, not
// one for every plugin. AnyPlugin holds a "/", which no plugin name does.
func TestPluginNamedStarIsNotAnyPlugin(t *testing.T) {
	w := newWorld(t, sessions.Options{})
	defer w.finish()
	for _, name := range []string{"*", "a"} {
		w.version(name, false)
	}
	k := sessions.Client("c1")
	if err := w.m.Seed(k, map[string]sessions.Seed{"*": {Lost: "not saved", Reason: "not-saved"}}, 1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, want string }{{"a", ""}, {"*", "not-saved"}} {
		if got := w.reset(k, c.name, nil); got != c.want {
			t.Errorf("plugin %q's first lease: reset %q, want %q", c.name, got, c.want)
		}
	}
}
