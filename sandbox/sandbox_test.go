package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

func newRuntime(t *testing.T) *sandbox.Runtime { return testplugins.Runtime(t) }

func compile(t *testing.T, rt *sandbox.Runtime, path string, p sandbox.Policy) *sandbox.Compiled {
	t.Helper()
	c, err := rt.Compile(context.Background(), testplugins.Bytes(t, path), p)
	if err != nil {
		t.Fatalf("compile %s: %v", path, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func instantiate(t *testing.T, c *sandbox.Compiled) *sandbox.Instance {
	t.Helper()
	inst, err := c.Instantiate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Close(context.Background()) })
	return inst
}

func callServlet(t *testing.T, inst *sandbox.Instance, tool, args string) (string, error) {
	t.Helper()
	// The host's encoding: name before arguments (the trap fixture relies on it).
	in := []byte(`{"params":{"name":"` + tool + `","arguments":` + args + `}}`)
	out, err := inst.Call(context.Background(), "call", in, nil)
	if err != nil {
		return "", err
	}
	var res struct {
		Content []struct{ Text string }
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	return res.Content[0].Text, nil
}

func TestCompileRefuses(t *testing.T) {
	rt := newRuntime(t)
	tests := []struct {
		name string
		wasm []byte
		want string
	}{
		{"empty", nil, "not a WebAssembly module"},
		{"text", []byte("#!/bin/sh\necho hello\n"), "not a WebAssembly module"},
		{"component", []byte("\x00asm\x0d\x00\x01\x00"), "component"},
		{"truncated", testplugins.Bytes(t, testplugins.Example(t, "counter"))[:100], "compile"},
		{"missing import", testplugins.Bytes(t, testplugins.Test(t, "missingimport")), "extism:host/user.launch_missiles, which this host does not provide"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := rt.Compile(context.Background(), tt.wasm, sandbox.NewPolicy())
			if err == nil {
				c.Close(context.Background())
				t.Fatal("compiled; want an error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

func TestInstancesKeepOwnState(t *testing.T) {
	c := compile(t, newRuntime(t), testplugins.Example(t, "counter"), sandbox.NewPolicy())
	a, b := instantiate(t, c), instantiate(t, c)
	for i, want := range []string{"1", "2", "3"} {
		got, err := callServlet(t, a, "count", `{}`)
		if err != nil || got != want {
			t.Fatalf("call %d on a: %q, %v; want %q", i, got, err, want)
		}
	}
	if got, err := callServlet(t, b, "count", `{}`); err != nil || got != "1" {
		t.Errorf("first call on b: %q, %v; want 1 (state leaked between instances?)", got, err)
	}
}

func TestGuestErrorKeepsInstance(t *testing.T) {
	inst := instantiate(t, compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy()))
	_, err := callServlet(t, inst, "fail", `{}`)
	var ge *sandbox.GuestError
	if !errors.As(err, &ge) || ge.Message != "failed on purpose" {
		t.Fatalf("err = %v; want a GuestError with the guest's message", err)
	}
	if got, err := callServlet(t, inst, "echo", `{"text":"still here"}`); err != nil || got != "still here" {
		t.Errorf("call after a guest error: %q, %v", got, err)
	}
}

func TestTrapClosesInstance(t *testing.T) {
	tests := []struct{ plugin, tool string }{
		{"trap", "boom"},     // unreachable
		{"servlet", "panic"}, // Go panic: the runtime exits
	}
	for _, tt := range tests {
		t.Run(tt.plugin+"/"+tt.tool, func(t *testing.T) {
			inst := instantiate(t, compile(t, newRuntime(t), testplugins.Test(t, tt.plugin), sandbox.NewPolicy()))
			_, err := callServlet(t, inst, tt.tool, `{}`)
			var te *sandbox.TrapError
			if !errors.As(err, &te) {
				t.Fatalf("err = %v; want a TrapError", err)
			}
			if inst.Err() == nil {
				t.Error("instance still usable after a trap")
			}
			if _, err := callServlet(t, inst, "echo", `{}`); !errors.Is(err, sandbox.ErrClosed) {
				t.Errorf("call after trap: %v; want ErrClosed", err)
			}
		})
	}
}

func TestDeadlineStopsSpinningGuest(t *testing.T) {
	c := compile(t, newRuntime(t), testplugins.Test(t, "loop"), sandbox.NewPolicy().WithCallTimeout(100*time.Millisecond))
	inst := instantiate(t, c)
	_, err := callServlet(t, inst, "spin", `{}`)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want context.DeadlineExceeded", err)
	}
	if inst.Err() == nil {
		t.Error("instance still usable after its deadline")
	}
}

func TestCancelStopsSpinningGuest(t *testing.T) {
	inst := instantiate(t, compile(t, newRuntime(t), testplugins.Test(t, "loop"), sandbox.NewPolicy()))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := inst.Call(ctx, "call", []byte(`{"params":{"name":"spin"}}`), nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v; want context.Canceled", err)
	}
}

func TestOutputLimitTrapsBeforeCopy(t *testing.T) {
	c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy().WithMaxOutput(1000))
	inst := instantiate(t, c)
	_, err := callServlet(t, inst, "repeat", `{"text":"x","count":5000}`)
	var he *sandbox.HostCallError
	if !errors.As(err, &he) || !strings.Contains(he.Reason, "over the 1000-byte limit") {
		t.Fatalf("err = %v; want a HostCallError about the output limit", err)
	}
}

func TestConfigAndVars(t *testing.T) {
	c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy().WithConfig(map[string]string{"greeting": "hi"}))
	inst := instantiate(t, c)
	if got, err := callServlet(t, inst, "config", `{"key":"greeting"}`); err != nil || got != "hi" {
		t.Errorf("config greeting: %q, %v", got, err)
	}
	if got, err := callServlet(t, inst, "config", `{"key":"HOME"}`); err != nil || got != "<unset>" {
		t.Errorf("config HOME: %q, %v; want <unset>", got, err)
	}
	for _, want := range []string{"1", "2"} {
		if got, err := callServlet(t, inst, "var_count", `{}`); err != nil || got != want {
			t.Errorf("var_count: %q, %v; want %s", got, err, want)
		}
	}
}

func TestGuestOutputGoesToLog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	inst := instantiate(t, compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy().WithLogger(log)))
	if _, err := callServlet(t, inst, "print", `{"text":"marker-123"}`); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`msg="guest stdout" line=marker-123`, `msg="guest stderr" line=marker-123`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, buf.String())
		}
	}
}

func TestCompiledCloseClosesInstances(t *testing.T) {
	rt := newRuntime(t)
	c, err := rt.Compile(context.Background(), testplugins.Bytes(t, testplugins.Example(t, "counter")), sandbox.NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	inst, err := c.Instantiate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := inst.Call(context.Background(), "call", []byte(`{}`), nil); err == nil {
		t.Error("call on an instance of a closed module succeeded")
	}
}

// TestImageClosedUnderInstantiate: an instance whose image was closed
// before wazero allocated its memory (Close ran under the instantiation)
// fails to start with ErrClosed, from Instantiate and from Restore alike.
// It panicked the process: the first allocation, mapping the closed
// image, returned nil, which wazero slices to the memory's minimum.
func TestImageClosedUnderInstantiate(t *testing.T) {
	c := compile(t, newRuntime(t), testplugins.Example(t, "counter"), sandbox.NewPolicy())
	snap, err := instantiate(t, c).Snapshot(context.Background()) // the first: its state is the image
	if err != nil {
		t.Fatal(err)
	}
	if !c.CloseImageFile() {
		t.Skip("no image file to map here")
	}
	if inst, err := c.Instantiate(context.Background()); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Instantiate: %v, %v; want ErrClosed", inst, err)
	}
	if inst, err := c.Restore(context.Background(), snap); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Restore: %v, %v; want ErrClosed", inst, err)
	}
}

// TestCloseUnderInstantiate: closing a module while instances of it start
// and restore (a retired plugin version, closed while a session's state is
// handed over into it) fails each with ErrClosed or lets it finish; it never
// panics, and once Close returned, both fail.
func TestCloseUnderInstantiate(t *testing.T) {
	rt := newRuntime(t)
	wasm := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	ctx := context.Background()
	for range 50 {
		c, err := rt.Compile(ctx, wasm, sandbox.NewPolicy())
		if err != nil {
			t.Fatal(err)
		}
		first, err := c.Instantiate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		snap, err := first.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		closed := make(chan error, 1)
		go func() { closed <- c.Close(ctx) }()
		start := []func() (*sandbox.Instance, error){
			func() (*sandbox.Instance, error) { return c.Instantiate(ctx) },
			func() (*sandbox.Instance, error) { return c.Restore(ctx, snap) },
		}
		for k := range 6 {
			inst, err := start[k%2]()
			switch {
			case err == nil:
				inst.Close(ctx)
			case !errors.Is(err, sandbox.ErrClosed):
				t.Fatalf("start %d under Close: %v, want ErrClosed", k, err)
			}
		}
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		for k, f := range start {
			if _, err := f(); !errors.Is(err, sandbox.ErrClosed) {
				t.Fatalf("start %d after Close: %v, want ErrClosed", k, err)
			}
		}
	}
}

// TestDroppedLevelsSpendNoLogBudget: a guest's log the logger does not
// take (below its level) spends none of the instance's log rate limit,
// which is for what is written: 200 info lines under a warn logger,
// faster than the limit refills, drop nothing by the limit, so a warning
// after them would be written, and no "dropped by the rate limit" warning
// is logged. Before, the limit was spent first, and the guest's warnings
// after its dropped debug logs were dropped with them.
func TestDroppedLevelsSpendNoLogBudget(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	inst := instantiate(t, compile(t, newRuntime(t), testplugins.Test(t, "logcall"), sandbox.NewPolicy().WithLogger(log)))
	for range 200 {
		if _, err := callServlet(t, inst, "log", `{}`); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(buf.String(), "rate limit") {
		t.Errorf("info lines a warn logger drops spent the log rate limit:\n%s", buf.String())
	}
}
