package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// restored snapshots inst and restores the snapshot into a fresh instance
// of c, which the test closes.
func restored(t *testing.T, c *sandbox.Compiled, inst *sandbox.Instance) (*sandbox.Instance, []byte) {
	t.Helper()
	snap, err := inst.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	fresh, err := c.Restore(context.Background(), snap)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	t.Cleanup(func() { fresh.Close(context.Background()) })
	return fresh, snap
}

func TestSnapshotRestore(t *testing.T) {
	rt := newRuntime(t)
	tests := []struct {
		name   string
		path   string
		before []string // calls of tool before the snapshot, with these arguments
		tool   string
		args   string
		want   []string // what calls after the restore return, on both instances
	}{
		// The counter keeps its count in a non-exported WAT global.
		{name: "counter global", path: testplugins.Example(t, "counter"), tool: "count", args: `{}`,
			before: []string{"", "", ""}, want: []string{"4", "5"}},
		// The servlet, built with the Extism Go PDK, keeps a count in an
		// Extism var.
		{name: "servlet vars", path: testplugins.Test(t, "servlet"), tool: "var_count", args: `{}`,
			before: []string{"", ""}, want: []string{"3", "4"}},
		// ... and a slice on the Go heap.
		{name: "servlet Go heap", path: testplugins.Test(t, "servlet"), tool: "remember", args: `{"text":"c"}`,
			before: []string{"a", "b"}, want: []string{"a,b,c", "a,b,c,c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := compile(t, rt, tt.path, sandbox.NewPolicy())
			if err := c.CanSnapshot(); err != nil {
				t.Fatal(err)
			}
			inst := instantiate(t, c)
			for _, a := range tt.before {
				args := tt.args
				if a != "" {
					args = `{"text":"` + a + `"}`
				}
				if _, err := callServlet(t, inst, tt.tool, args); err != nil {
					t.Fatal(err)
				}
			}
			fresh, snap := restored(t, c, inst)
			t.Logf("snapshot: %d bytes", len(snap))
			for _, want := range tt.want {
				for _, i := range []*sandbox.Instance{inst, fresh} {
					got, err := callServlet(t, i, tt.tool, tt.args)
					if err != nil {
						t.Fatal(err)
					}
					if !strings.HasSuffix(got, want) {
						t.Errorf("after restore: got %q, want %q", got, want)
					}
				}
			}
			// A snapshot of the restored instance restores too.
			again, _ := restored(t, c, fresh)
			if _, err := callServlet(t, again, tt.tool, tt.args); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRestoreRefuses(t *testing.T) {
	rt := newRuntime(t)
	counter := compile(t, rt, testplugins.Example(t, "counter"), sandbox.NewPolicy())
	servlet := compile(t, rt, testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	snap, err := instantiate(t, counter).Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := servlet.Restore(context.Background(), snap); !errors.Is(err, sandbox.ErrSnapshotMismatch) {
		t.Errorf("restore into other code: got %v, want ErrSnapshotMismatch", err)
	}
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": snap[:len(snap)-3],
		"garbage":   append(snap[:37:37], "not zstd at all"...),
	} {
		if _, err := counter.Restore(context.Background(), b); !errors.Is(err, sandbox.ErrBadSnapshot) {
			t.Errorf("%s: got %v, want ErrBadSnapshot", name, err)
		}
	}
}
