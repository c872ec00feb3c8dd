package plugins_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// callText calls tool on inst with args and returns its first text block.
func callText(t *testing.T, p *plugins.Plugin, inst *plugins.Instance, tool, args string) string {
	t.Helper()
	for _, tl := range p.Tools() {
		if tl.Name != tool {
			continue
		}
		res, err := inst.CallTool(context.Background(), &plugins.Call{Tool: tl, Arguments: json.RawMessage(args)})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		var c struct{ Text string }
		if err := json.Unmarshal(res.Content[0], &c); err != nil {
			t.Fatal(err)
		}
		return c.Text
	}
	t.Fatalf("no tool %q", tool)
	return ""
}

// TestSaveState: the host snapshots the notes plugin (Go, abi/guest, v2
// interface) whole, although it exports a handoff pair of its own, and a
// restored instance goes on where the saved one was.
func TestSaveState(t *testing.T) {
	rt := newRuntime(t)
	p := load(t, rt, testplugins.Example(t, "notes"), plugins.Options{})
	inst, err := p.NewInstance(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(context.Background())
	callText(t, p, inst, "note_add", `{"text":"one"}`)
	callText(t, p, inst, "note_add", `{"text":"two"}`)
	st, err := inst.SaveState(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !st.Host || st.SHA256 != p.SHA256() {
		t.Fatalf("state: host %v, sha256 %s; want a host snapshot of %s", st.Host, st.SHA256, p.SHA256())
	}
	t.Logf("notes snapshot: %d bytes", len(st.Data))
	fresh, err := p.RestoreState(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close(context.Background())
	for _, i := range []*plugins.Instance{inst, fresh} {
		if got := callText(t, p, i, "note_add", `{"text":"three"}`); got != "note 3 saved" {
			t.Errorf("note_add after restore: %q", got)
		}
		if got, want := callText(t, p, i, "note_list", `{}`), "1. one\n2. two\n3. three\n"; got != want {
			t.Errorf("note_list after restore: %q, want %q", got, want)
		}
	}

	// Another plugin refuses the snapshot; the guest's own state goes
	// to any version that restores it.
	other := load(t, rt, testplugins.Test(t, "notesbad"), plugins.Options{})
	if _, err := other.RestoreState(context.Background(), st); !errors.Is(err, sandbox.ErrSnapshotMismatch) {
		t.Errorf("restore into other code: %v, want ErrSnapshotMismatch", err)
	}
	gst, err := inst.SaveGuestState(context.Background())
	if err != nil || gst.Host {
		t.Fatalf("guest state: %+v, %v", gst, err)
	}
	again, err := p.RestoreState(context.Background(), gst)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close(context.Background())
	if got, want := callText(t, p, again, "note_list", `{}`), "1. one\n2. two\n3. three\n"; got != want {
		t.Errorf("note_list after the guest's restore: %q, want %q", got, want)
	}
}

// TestSaveStateRefused: with neither a host snapshot nor a handoff pair,
// saving fails with the host's reason.
func TestSaveStateRefused(t *testing.T) {
	rt := newRuntime(t)
	path := testplugins.Test(t, "grants")
	pol := sandbox.NewPolicy().WithMounts(sandbox.Mount{HostPath: t.TempDir(), GuestPath: "/data"})
	p := load(t, rt, path, plugins.Options{Policy: &pol})
	if err := p.CanSnapshot(); !errors.Is(err, sandbox.ErrSnapshotRefused) {
		t.Fatalf("CanSnapshot: %v", err)
	}
	inst, err := p.NewInstance(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(context.Background())
	if _, err := inst.SaveState(context.Background()); !errors.Is(err, sandbox.ErrSnapshotRefused) {
		t.Errorf("SaveState: %v, want ErrSnapshotRefused", err)
	}
}
