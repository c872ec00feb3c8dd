package host_test

// The hostile-plugin suite (issue 6). Each case runs a plugin that does what
// no plugin should, and asserts three things: the call ends, within a bound,
// in a clear error (or, where the host is documented to shrug the misuse
// off, in a result); the same session goes on being served, by a fresh
// instance of the plugin when the old one had to be discarded; and a second
// session calling another plugin at the same moment is served, promptly and
// correctly. docs/SECURITY.md gives the threat model and what each case
// proves. The fixtures are internal/testplugins/src/hostile*.

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// hostileChild is set in the environment of a child process that runs one
// case of this suite, for a case that crashed the whole host: the child
// dies, not the test binary, and the parent reports how.
const hostileChild = "WASMTOOLS_HOSTILE_CHILD"

// slowCallFloor is the least bound on each call of the second session
// while a hostile call runs; alongside raises it on a slow machine. A
// counter call takes microseconds; the floor is for a loaded machine under
// the race detector.
const slowCallFloor = 5 * time.Second

// baselineCalls is how many calls the second session makes, before the
// hostile call starts, to measure how fast the machine is now.
const baselineCalls = 3

// logTally counts the host's log records by message, and keeps only the
// first 64 KiB of them, so that a flooding guest cannot make the test
// itself grow without bound.
type logTally struct {
	mu    sync.Mutex
	head  []byte
	byMsg map[string]int
}

const tallyHead = 64 << 10

// Write takes one record: slog's text handler writes each record with one
// Write.
func (l *logTally) Write(p []byte) (int, error) {
	msg := logMsg(p)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byMsg == nil {
		l.byMsg = map[string]int{}
	}
	if room := tallyHead - len(l.head); room > 0 {
		l.head = append(l.head, p[:min(room, len(p))]...)
	}
	l.byMsg[msg]++
	return len(p), nil
}

// count reports how many records with message msg were logged.
func (l *logTally) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byMsg[msg]
}

func (l *logTally) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.head)
}

// logMsg returns the msg attribute of a record from slog's text handler.
func logMsg(rec []byte) string {
	i := bytes.Index(rec, []byte(" msg="))
	if i < 0 {
		return ""
	}
	s := string(rec[i+len(" msg="):])
	if strings.HasPrefix(s, `"`) {
		if q, err := strconv.QuotedPrefix(s); err == nil {
			u, _ := strconv.Unquote(q)
			return u
		}
	}
	if j := strings.IndexAny(s, " \n"); j >= 0 {
		return s[:j]
	}
	return s
}

// newHostileFixture is newFixture for plugins that may fail to load: it
// serves what loads and returns the load errors. files are copied as
// newFixture does (name -> path); raw files are written as given. The
// host's log goes to the returned tally.
func newHostileFixture(t *testing.T, opts *host.Options, policy sandbox.Policy, files map[string]string, raw map[string][]byte) (*fixture, *logTally, []error) {
	t.Helper()
	ctx := context.Background()
	tally := &logTally{}
	logger := newTestLogger(tally)
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	dir := testplugins.Folder(t, files)
	for name, b := range raw {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pol := policy.WithLogger(logger)
	cat, errs := plugins.LoadAll(ctx, rt, []string{dir}, func(string) plugins.Options { return plugins.Options{Policy: &pol} })
	t.Cleanup(func() { cat.Close(ctx) })
	o := host.Options{}
	if opts != nil {
		o = *opts
	}
	o.Logger = logger
	h := host.New(plugins.NewStatic(cat), &o)
	t.Cleanup(func() { h.Close(ctx) })
	return &fixture{rt: rt, h: h, log: &syncBuffer{}}, tally, errs
}

// alongside runs hostile, which makes a hostile call, while a second
// session calls the counter example over and over, from before hostile
// starts until after it returns. Each of those calls must be served,
// counting up from 1. Those made while hostile runs must each take at most
// 20 times the slowest of the baselineCalls made before it (the first
// creates the instance), and at least slowCallFloor: a bound that follows
// the machine's load rather than a fixed wall-clock time.
func alongside(t *testing.T, f *fixture, hostile func()) {
	t.Helper()
	alongsideWithin(t, f, slowCallFloor, hostile)
}

// alongsideWithin is alongside with floor in place of slowCallFloor, for a
// hostile call that may pause the whole host for a time measured in the
// same run.
func alongsideWithin(t *testing.T, f *fixture, floor time.Duration, hostile func()) {
	t.Helper()
	other := f.connect(t, "", nil)
	// count makes call n and reports how long it took, or false after
	// reporting a wrong answer.
	count := func(n int) (time.Duration, bool) {
		start := time.Now()
		res, err := other.CallTool(context.Background(), &mcp.CallToolParams{Name: "count", Arguments: map[string]any{}})
		took := time.Since(start)
		switch {
		case err != nil:
			t.Errorf("second session, call %d alongside the hostile call: %v", n, err)
			return took, false
		case res.IsError || text(res) != strconv.Itoa(n):
			t.Errorf("second session, call %d alongside the hostile call: %q (isError %v), want %d", n, text(res), res.IsError, n)
			return took, false
		}
		return took, true
	}
	var base time.Duration
	for n := 1; n <= baselineCalls; n++ {
		took, ok := count(n)
		if !ok {
			hostile()
			return
		}
		base = max(base, took)
	}
	bound := max(floor, 20*base)
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := baselineCalls
		var slowest time.Duration
		defer func() {
			t.Logf("%d calls alongside the hostile call; the slowest took %v (bound %v)", n-baselineCalls, slowest, bound)
			done <- n
		}()
		for {
			n++
			took, ok := count(n)
			if !ok {
				return
			}
			slowest = max(slowest, took)
			if took > bound {
				t.Errorf("second session, call %d alongside the hostile call took %v (bound %v: 20 times the slowest call before it, %v, and at least %v)", n, took, bound, base, floor)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	defer func() {
		close(stop)
		<-done
		other.Close()
	}()
	hostile()
}

// checkClear checks what every result of a hostile call must be: valid
// UTF-8, within the result cap, and free of Go runtime errors and stacks,
// which mean that the host, not the guest, failed.
func checkClear(t *testing.T, res *mcp.CallToolResult) {
	t.Helper()
	s := text(res)
	if !utf8.ValidString(s) {
		t.Errorf("result is not valid UTF-8: %q", clip(s))
	}
	if n := utf8.RuneCountInString(s); n > host.DefaultMaxResultRunes+200 {
		t.Errorf("result of %d characters: over the %d-character cap", n, host.DefaultMaxResultRunes)
	}
	for _, bad := range []string{"runtime error", "goroutine ", "panic:"} {
		if strings.Contains(s, bad) {
			t.Errorf("result shows a failure of the host, not of the guest (%q): %q", bad, clip(s))
		}
	}
}

// clip shortens s for a failure message.
func clip(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "…"
	}
	return s
}

// resetOf returns the stateReset reason of a result, or "".
func resetOf(res *mcp.CallToolResult) string {
	r, _ := res.Meta[host.MetaStateReset].(map[string]any)
	s, _ := r["reason"].(string)
	return s
}

// hostileCase is one hostile call.
type hostileCase struct {
	tool string
	// fail says the result must be an isError result; want lists strings
	// its text must contain.
	fail bool
	want []string
	// reset is the stateReset reason the plugin's next call must report:
	// the hostile call discarded the instance. "" means it kept it.
	reset string
	// check, if set, replaces the fail and want checks; anyReset accepts
	// the next call with or without a reset.
	check    func(t *testing.T, res *mcp.CallToolResult)
	anyReset bool
	// isolate runs the case in a child process: it crashed the host.
	isolate bool
}

// trapped is a case whose guest must trap in host function fn, with a
// reason containing why.
func trapped(tool, fn, why string) hostileCase {
	return hostileCase{tool: tool, fail: true, want: []string{`tool "` + tool + `" crashed`, "host function " + fn + ":", why, "state for this session was reset"}, reset: "trap"}
}

// failed is a case whose call must fail without the instance being
// discarded.
func failed(tool string, want ...string) hostileCase {
	return hostileCase{tool: tool, fail: true, want: append([]string{`tool "` + tool + `" failed`}, want...)}
}

// served is a case the host must serve as a result.
func served(tool string, want ...string) hostileCase {
	return hostileCase{tool: tool, want: want}
}

// hostileCalls groups the cases by plugin, each with its tool that works.
var hostileCalls = []struct {
	plugin, ok string
	cases      []hostileCase
}{
	{"hostileabi", "abi_ok", []hostileCase{
		// Kernel loads and stores outside kernel memory.
		trapped("load_u8_huge", "load_u8", "outside Extism memory"),
		trapped("load_u8_zero", "load_u8", "outside Extism memory"),
		trapped("load_u64_straddle", "load_u64", "outside Extism memory"),
		trapped("load_u64_wrap", "load_u64", "outside Extism memory"),
		trapped("store_u8_huge", "store_u8", "outside Extism memory"),
		trapped("store_u64_wrap", "store_u64", "outside Extism memory"),
		// Input past its end; an input set outside kernel memory.
		trapped("input_load_u8_huge", "input_load_u8", "past the"),
		trapped("input_load_u64_wrap", "input_load_u64", "past the"),
		trapped("input_set_huge", "input_set", "outside Extism memory"),
		// Outputs over the limit or outside kernel memory.
		trapped("output_set_huge_len", "output_set", "over the 4194304-byte limit"),
		trapped("output_set_huge_off", "output_set", "outside Extism memory"),
		trapped("output_set_wrap", "output_set", "outside Extism memory"),
		// Error messages that are not live blocks.
		trapped("error_set_huge", "error_set", "not a live memory block"),
		trapped("error_set_inside", "error_set", "not a live memory block"),
		// Misuse the kernel documents as harmless.
		served("length_huge", "length of a bad offset is 0"),
		served("free_huge", "free of bad offsets is ignored"),
		// Config and vars.
		trapped("config_get_huge", "config_get", "not a live memory block"),
		trapped("var_get_huge", "var_get", "not a live memory block"),
		trapped("var_set_huge_key", "var_set", "not a live memory block"),
		trapped("var_set_huge_value", "var_set", "not a live memory block"),
		trapped("var_set_over", "var_set", "over the 1048576-byte limit"),
		// Kernel logging.
		trapped("log_trace_huge", "log_trace", "not a live memory block"),
		trapped("log_debug_huge", "log_debug", "not a live memory block"),
		trapped("log_info_huge", "log_info", "not a live memory block"),
		trapped("log_warn_huge", "log_warn", "not a live memory block"),
		trapped("log_error_huge", "log_error", "not a live memory block"),
		// Allocation past the kernel memory limit. alloc(-1) asks for
		// 2^64-1 bytes: it must trap like any other allocation over the
		// limit. (Until de5bfd2 the size wrapped around in kernel.alloc
		// and the guest got a block of length 2^64-1 and no memory: used
		// as an error message it crashed the whole host process, with a
		// slice panic in Instance.Call outside wazero's recover; the
		// isolated case runs in a child process for that reason.)
		trapped("alloc_huge", "alloc", "Extism memory limit"),
		trapped("alloc_wrap", "alloc", "Extism memory limit"),
		func() hostileCase {
			c := trapped("alloc_wrap_error_set", "alloc", "Extism memory limit")
			c.isolate = true
			return c
		}(),
		trapped("alloc_wrap_log", "alloc", "Extism memory limit"),
		trapped("alloc_wrap_notify", "alloc", "Extism memory limit"),
		// The input read after the guest freed the block holding it: the
		// host may serve the input or trap naming the function, never
		// index kernel memory past its end (a Go runtime error, until
		// de5bfd2).
		{tool: "input_freed_load", anyReset: true, check: func(t *testing.T, res *mcp.CallToolResult) {
			if res.IsError && !strings.Contains(text(res), "host function input_load_u8:") {
				t.Errorf("input read after free: %q; want the input, or a trap naming input_load_u8", clip(text(res)))
			}
		}},
		// MCP host functions given offsets that are not live blocks,
		// input over 1 MiB, invalid UTF-8 and invalid JSON.
		trapped("notify_progress_huge", "notify_progress", "not a live memory block"),
		trapped("notify_logging_message_huge", "notify_logging_message", "not a live memory block"),
		trapped("write_record_huge", "write_record", "not a live memory block"),
		trapped("notify_resource_updated_huge", "notify_resource_updated", "not a live memory block"),
		trapped("notify_progress_over", "notify_progress", "over the 1048576-byte limit"),
		trapped("notify_progress_utf8", "notify_progress", "not valid UTF-8"),
		trapped("notify_logging_message_utf8", "notify_logging_message", "not valid UTF-8"),
		trapped("write_record_utf8", "write_record", "not valid UTF-8"),
		trapped("notify_resource_updated_utf8", "notify_resource_updated", "not valid UTF-8"),
		trapped("notify_progress_json", "notify_progress", "input is not the expected JSON"),
		trapped("notify_logging_message_json", "notify_logging_message", "input is not the expected JSON"),
		trapped("notify_logging_message_level", "notify_logging_message", `unknown logging level "loud"`),
		// write_record reports a bad record in its answer, which the
		// fixture makes its error message.
		failed("write_record_json", "input is not the expected JSON"),
		// notify_resource_updated needs {"uri": "..."}.
		trapped("notify_resource_updated_json", "notify_resource_updated", `{"uri"`),
	}},
	{"hostileelicit", "elicit_ok", []hostileCase{
		trapped("create_elicitation_huge", "create_elicitation", "not a live memory block"),
		trapped("create_elicitation_utf8", "create_elicitation", "not valid UTF-8"),
		// create_elicitation answers a bad request with a cancel and the
		// reason, which the fixture makes its error message.
		failed("create_elicitation_json", `"action":"cancel"`, "input is not the expected JSON"),
	}},
	{"hostileoutput", "output_ok", []hostileCase{
		trapped("output_over", "output_set", "over the 4194304-byte limit"),
		trapped("alloc_over", "alloc", "Extism memory limit of 16777216 bytes"),
		trapped("alloc_loop", "alloc", "Extism memory limit of 16777216 bytes"),
		served("alloc_most", "filled 15 MiB of kernel memory"),
		{tool: "huge_text", check: func(t *testing.T, res *mcp.CallToolResult) {
			if res.IsError || len(res.Content) != 2 {
				t.Fatalf("huge text: isError %v, %d blocks; want the text cut, and a note", res.IsError, len(res.Content))
			}
			// The block's JSON without its text, and a comma, count
			// too: 26 characters.
			if got := res.Content[0].(*mcp.TextContent).Text; got != strings.Repeat("a", host.DefaultMaxResultRunes-26) {
				t.Errorf("huge text kept %d characters, want %d", len(got), host.DefaultMaxResultRunes-26)
			}
			if note := res.Content[1].(*mcp.TextContent).Text; !strings.Contains(note, "4144291 characters of text cut") {
				t.Errorf("note = %q", note)
			}
		}},
		failed("huge_error", `failed: aaaaaaaa`, "characters of text cut"),
		failed("output_bad_utf8", "output is not valid UTF-8"),
		failed("output_bad_json", "output is not the expected JSON"),
		failed("output_trailing", "output is not the expected JSON: invalid character", "after top-level value"),
		failed("output_wrong_shape", "output is not the expected JSON"),
		{tool: "output_bad_block", fail: true, want: []string{`plugin "hostileoutput" returned a result that is not valid MCP`}},
		failed("output_empty", "empty output"),
		failed("output_deep", "exceeded max depth"),
		failed("error_bad_utf8", "is not UTF-8"),
		// _meta keys under the host's prefix are the host's word to the
		// client (an instance was reset, records were written): a guest
		// must not be able to claim them. Its own keys pass through.
		{tool: "meta_forge", check: func(t *testing.T, res *mcp.CallToolResult) {
			if res.IsError || text(res) != "forged" || res.Meta["x.example/k"] != "v" {
				t.Errorf("meta_forge: %q, _meta %v; want the guest's result with its own _meta key", text(res), res.Meta)
			}
			for k := range res.Meta {
				if strings.HasPrefix(k, host.MetaPrefix) {
					t.Errorf("the guest set _meta[%q] = %v, a key of the host's namespace", k, res.Meta[k])
				}
			}
		}},
	}},
	{"hostilegrow", "grow_ok", []hostileCase{
		// memory.grow fails at the 64 MiB default limit, as the Wasm spec
		// says (the guest sees -1), and the instance lives on.
		served("grow", "grew to 1024 pages"),
		served("grow_huge", "refused"),
	}},
	// hostilerecurse's recursion is TestHostileRecursion's: the pause it
	// causes is bounded by what it costs alone, measured there.
	// Issue 12. One log message with 20 000 bytes of data: until the cap,
	// one message of any size up to 1 MiB went to the host log and the
	// client.
	{"hostileflood", "flood_ok", []hostileCase{
		trapped("log_huge", "notify_logging_message", "over the 16384-byte limit"),
		// A one-character block with 200 000 bytes of _meta, and 5 000
		// empty blocks: the cap counted neither.
		{tool: "meta_huge", check: func(t *testing.T, res *mcp.CallToolResult) {
			checkWire(t, res)
			if res.IsError || res.Meta["big"] != nil || !strings.Contains(text(res), "1 _meta keys dropped") {
				t.Errorf("meta_huge: %q, _meta keys %d; want the text, the key dropped and a note", clip(text(res)), len(res.Meta))
			}
		}},
		{tool: "blocks_many", check: func(t *testing.T, res *mcp.CallToolResult) {
			checkWire(t, res)
			// At most 1 000 blocks and the note saying how many were dropped.
			if n := len(res.Content); res.IsError || n > 1001 || !strings.Contains(text(res), "content blocks: 4000 dropped") {
				t.Errorf("blocks_many: %d blocks, note %q; want at most 1001 and a note", n, clip(text(res)))
			}
		}},
	}},
	// notify_resource_updated for another plugin's URI.
	{"hostileupdate", "update_ok", []hostileCase{
		trapped("update_foreign", "notify_resource_updated", `"counter://secret" is not a resource of plugin "hostileupdate"`),
	}},
}

// checkWire checks that a result, as the client gets it, is within the
// result cap: all its JSON, _meta included, counted in characters, with
// room for the note and the host's own keys.
func checkWire(t *testing.T, res *mcp.CallToolResult) {
	t.Helper()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if n := utf8.RuneCount(b); n > host.DefaultMaxResultRunes+1000 {
		t.Errorf("the result is %d characters of JSON; want at most the %d-character cap and a note", n, host.DefaultMaxResultRunes)
	}
}

// hostileTimeout is the call timeout of the hostile suite: long enough for
// the slowest case (an 8 MiB error message written 8 bytes at a time) under
// the race detector. Where a loaded machine can take longer, a test uses
// hostileSafety as the timeout and bounds its calls by hostileTimeout or
// 20 times a baseline it measures, whichever is more.
const hostileTimeout = 10 * time.Second

// hostileSafety is the call timeout that only stops a wedged guest, in
// tests that bound their calls themselves.
const hostileSafety = 5 * time.Minute

func TestHostileCalls(t *testing.T) {
	files := map[string]string{"counter.wasm": testplugins.Example(t, "counter")}
	for _, g := range hostileCalls {
		files[g.plugin+".wasm"] = testplugins.Test(t, g.plugin)
	}
	f, logs, errs := newHostileFixture(t, nil, sandbox.NewPolicy().WithCallTimeout(hostileSafety), files, nil)
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	// The baseline is one of the slowest cases, memory.grow to the limit,
	// run alone first.
	ws := f.connect(t, "", nil)
	start := time.Now()
	if res := call(t, ws, "grow", nil); !strings.Contains(text(res), "grew to 1024 pages") {
		t.Fatalf("grow, alone: %q", text(res))
	}
	bound := max(hostileTimeout+5*time.Second, 20*time.Since(start))
	ws.Close() // its instance is freed with it, as checked at the end
	for _, g := range hostileCalls {
		for _, tc := range g.cases {
			t.Run(tc.tool, func(t *testing.T) {
				if tc.isolate && os.Getenv(hostileChild) == "" {
					runIsolated(t)
					return
				}
				runHostile(t, f, g.ok, tc, bound)
			})
		}
	}
	eventually(t, "every instance to be freed", func() bool { return f.h.LiveInstances() == 0 })
	if t.Failed() {
		t.Logf("host log (start):\n%s", clip(logs.String()))
	}
}

// runHostile makes the hostile call of tc in a new session, alongside a
// second session, and checks its result, that it took at most bound, and
// that the session goes on: the plugin's ok tool and another plugin serve
// it.
func runHostile(t *testing.T, f *fixture, ok string, tc hostileCase, bound time.Duration) {
	t.Helper()
	a := f.connect(t, "", nil)
	var res *mcp.CallToolResult
	var err error
	var took time.Duration
	alongside(t, f, func() {
		start := time.Now()
		res, err = a.CallTool(context.Background(), &mcp.CallToolParams{Name: tc.tool, Arguments: map[string]any{}})
		took = time.Since(start)
	})
	if err != nil {
		t.Fatalf("%s: %v; a hostile guest must get a tool result, not a protocol error", tc.tool, err)
	}
	if took > bound {
		t.Errorf("%s took %v (bound %v)", tc.tool, took, bound)
	}
	checkClear(t, res)
	if tc.check != nil {
		tc.check(t, res)
	} else {
		if res.IsError != tc.fail {
			t.Errorf("%s: isError %v, want %v: %q", tc.tool, res.IsError, tc.fail, clip(text(res)))
		}
		var missing []string
		for _, w := range tc.want {
			if !strings.Contains(text(res), w) {
				missing = append(missing, strconv.Quote(w))
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s: result lacks %s", tc.tool, strings.Join(missing, ", "))
		}
	}
	if t.Failed() {
		t.Logf("%s: result %q", tc.tool, clip(text(res)))
	}
	// The same session is served on: by the plugin, afresh if its instance
	// was discarded, and by another plugin.
	res = call(t, a, ok, nil)
	if res.IsError || text(res) != "ok" {
		t.Errorf("%s: the plugin's next call: %q (isError %v), want ok", tc.tool, clip(text(res)), res.IsError)
	}
	if got := resetOf(res); got != tc.reset && !tc.anyReset {
		t.Errorf("%s: the plugin's next call has stateReset %q, want %q", tc.tool, got, tc.reset)
	}
	if got := text(call(t, a, "count", nil)); got != "1" {
		t.Errorf("%s: the session's first count = %q, want 1", tc.tool, got)
	}
}

// runIsolated runs the current test in a child process (the test binary,
// with -test.run naming just it) and reports how the child ended: a case
// that crashes the host takes down the child, not the whole test run.
func runIsolated(t *testing.T) {
	t.Helper()
	var pattern []string
	for _, part := range strings.Split(t.Name(), "/") {
		pattern = append(pattern, "^"+regexp.QuoteMeta(part)+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run", strings.Join(pattern, "/"), "-test.count", "1", "-test.timeout", "2m", "-test.v")
	cmd.Env = append(os.Environ(), hostileChild+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		if !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
			t.Errorf("the child process ran no test:\n%s", clip(string(out)))
		}
		return
	}
	if why, frames := crashOf(string(out)); why != "" {
		t.Errorf("the process crashed (%v): a guest must never take the host (nor its clients) down:\n%s\n%s", err, why, strings.Join(frames, "\n"))
		return
	}
	t.Errorf("in a child process: %v\n%s", err, clip(string(out)))
}

// crashOf finds, in the output of a process that crashed, the panic or
// fatal error and the distinct frames of the host's own code and of the
// libraries it calls, innermost first.
func crashOf(out string) (why string, frames []string) {
	lines := strings.Split(out, "\n")
	seen := map[string]bool{}
	for i, line := range lines {
		if why == "" && (strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ")) {
			why = line
		}
		if why == "" || i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "\t") {
			continue
		}
		fn := line
		if j := strings.LastIndex(fn, "("); j > 0 {
			fn = fn[:j]
		}
		if seen[fn] || !strings.Contains(fn, "github.com/") || strings.Contains(fn, "host_test.") {
			continue
		}
		seen[fn] = true
		frames = append(frames, "\t"+fn+"  "+strings.TrimSpace(lines[i+1]))
		if len(frames) == 12 {
			break
		}
	}
	return why, frames
}

// floodBound is the most records or notifications a call of d may cause
// at a burst of burst and then rate per second, plus a margin.
func floodBound(d time.Duration, burst, rate float64) int {
	return int(burst+rate*d.Seconds()) + 5
}

// floodSeen is what reached the clients and the host's log during a
// flooding call: the progress notifications, the log notifications and
// the bytes of their data (a string), the resource updates a subscribed
// session got, and a count of host log records by message.
type floodSeen struct {
	progress                []*mcp.ProgressNotificationParams
	logs, logBytes, updates int
	logged                  func(msg string) int
}

func TestHostileTimeouts(t *testing.T) {
	const timeout = time.Second
	f, logs, errs := newHostileFixture(t, nil, sandbox.NewPolicy().WithCallTimeout(timeout), map[string]string{
		"counter.wasm":       testplugins.Example(t, "counter"),
		"loop.wasm":          testplugins.Test(t, "loop"),
		"hostileflood.wasm":  testplugins.Test(t, "hostileflood"),
		"hostileupdate.wasm": testplugins.Test(t, "hostileupdate"),
		"hostilepause.wasm":  testplugins.Test(t, "hostilepause"),
	}, nil)
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	tests := []struct {
		tool, ok string
		// check checks what reached the clients and the host's log
		// during a call that took d.
		check func(t *testing.T, d time.Duration, seen floodSeen)
	}{
		// An infinite loop that never calls the host.
		{"spin", "", nil},
		// create_message in a loop with 1 MiB the host takes long to
		// read and then refuses (no messages): its reading counts
		// against the timeout. Until stop 56 the whole function paused
		// the deadline, and the call ran for hours.
		{"sample_spin", "pause_ok", nil},
		// progress: a burst of 10, then 20 a second (docs/ABI.md).
		{"flood_progress", "flood_ok", func(t *testing.T, d time.Duration, seen floodSeen) {
			if max := floodBound(d, 10, 20); len(seen.progress) < 1 || len(seen.progress) > max {
				t.Errorf("%d progress notifications in %v; want 1 to %d", len(seen.progress), d, max)
			}
		}},
		// Issue 12: progress with a 60 000-byte message, in a loop. The
		// count was bounded, not the size.
		{"progress_big", "flood_ok", func(t *testing.T, d time.Duration, seen floodSeen) {
			if max := floodBound(d, 10, 20); len(seen.progress) < 1 || len(seen.progress) > max {
				t.Errorf("%d progress notifications in %v; want 1 to %d", len(seen.progress), d, max)
			}
			for _, p := range seen.progress {
				if len(p.Message) > 1024 {
					t.Fatalf("a progress message of %d bytes reached the client; want at most 1024", len(p.Message))
				}
			}
		}},
		// logging: a burst of 20, then 50 a second, to the client and to
		// the host log, with the rest counted.
		{"flood_log", "flood_ok", func(t *testing.T, d time.Duration, seen floodSeen) {
			max := floodBound(d, 20, 50)
			if seen.logs < 1 || seen.logs > max {
				t.Errorf("%d log notifications in %v; want 1 to %d", seen.logs, d, max)
			}
			logged := seen.logged
			if n := logged("plugin log"); n > max {
				t.Errorf("%d plugin log records in %v; want at most %d", n, d, max)
			}
			if logged("plugin log messages dropped by the rate limit") != 1 {
				t.Error("the dropped messages were not counted in the host log")
			}
		}},
		// Issue 12: log messages of 15 000 bytes in a loop. The count
		// limit let 20 + 50/s of them through, 1 MB a second; a call may
		// now send 64 KiB, then 16 KiB a second.
		{"log_big", "flood_ok", func(t *testing.T, d time.Duration, seen floodSeen) {
			max := floodBound(d, 64<<10, 16<<10) + 15000
			if seen.logBytes < 1 || seen.logBytes > max {
				t.Errorf("%d bytes of log data reached the client in %v; want 1 to %d", seen.logBytes, d, max)
			}
			if n := seen.logged("plugin log") * 15000; n > max {
				t.Errorf("%d bytes of log data reached the host log in %v; want at most %d", n, d, max)
			}
			if seen.logged("plugin log messages dropped by the rate limit") != 1 {
				t.Error("the dropped messages were not counted in the host log")
			}
		}},
		// Issue 12: notify_resource_updated in a loop. 100 000 updates
		// reached a subscribed session; now 10, then 10 a second.
		{"update_flood", "update_ok", func(t *testing.T, d time.Duration, seen floodSeen) {
			max := floodBound(d, 10, 10)
			if seen.updates < 1 || seen.updates > max {
				t.Errorf("%d resource updates reached the subscribed session in %v; want 1 to %d", seen.updates, d, max)
			}
			if n := seen.logged("resource updated notification sent"); n > max {
				t.Errorf("%d resource update records in the host log in %v; want at most %d", n, d, max)
			}
			if seen.logged("plugin resource updates dropped by the rate limit") != 1 {
				t.Error("the dropped updates were not counted in the host log")
			}
		}},
		// The kernel's log_info and WASI stdout reach the operator's log
		// as notify_logging_message does, and must be bounded as it is.
		// (Until de5bfd2 neither was: a guest wrote some 600 000 records a
		// second to the host log, for as long as its call lasted.)
		{"flood_kernel_log", "flood_ok", func(t *testing.T, d time.Duration, seen floodSeen) {
			if n, max := seen.logged("guest log"), floodBound(d, 20, 50); n > max {
				t.Errorf("%d guest log records in %v (log_info in a loop); want at most %d, as for notify_logging_message", n, d, max)
			}
		}},
		{"flood_stdout", "flood_ok", func(t *testing.T, d time.Duration, seen floodSeen) {
			if n, max := seen.logged("guest stdout"), floodBound(d, 20, 50); n > max {
				t.Errorf("%d guest stdout records in %v (fd_write in a loop); want at most %d, as for notify_logging_message", n, d, max)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			var pl progressLog
			var clientLogs, clientLogBytes, updates atomic.Int64
			a := f.connect(t, "2025-11-25", &mcp.ClientOptions{
				ProgressNotificationHandler: pl.handler,
				LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
					s, _ := req.Params.Data.(string)
					clientLogBytes.Add(int64(len(s)))
					clientLogs.Add(1)
					activity.fire()
				},
			})
			if err := a.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
				t.Fatal(err)
			}
			// Another session, subscribed to the resource the plugin
			// says changed, and served after the flood.
			sub := f.connect(t, "2025-11-25", &mcp.ClientOptions{
				ResourceUpdatedHandler: func(context.Context, *mcp.ResourceUpdatedNotificationRequest) { updates.Add(1); activity.fire() },
			})
			if err := sub.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "flood://item/1"}); err != nil {
				t.Fatal(err)
			}
			before := map[string]int{}
			for _, m := range []string{"plugin log", "plugin log messages dropped by the rate limit", "guest log", "guest stdout", "resource updated notification sent", "plugin resource updates dropped by the rate limit"} {
				before[m] = logs.count(m)
			}
			var res *mcp.CallToolResult
			var err error
			var took time.Duration
			alongside(t, f, func() {
				// Bounded, so that a call the timeout does not stop
				// fails the test rather than hanging it.
				ctx, cancel := context.WithTimeout(context.Background(), timeout+60*time.Second)
				defer cancel()
				start := time.Now()
				res, err = a.CallTool(ctx, &mcp.CallToolParams{Name: tt.tool, Arguments: map[string]any{}, Meta: mcp.Meta{"progressToken": "flood"}})
				took = time.Since(start)
			})
			if err != nil {
				t.Fatalf("%v; want a timed-out result", err)
			}
			checkClear(t, res)
			if !res.IsError || !strings.Contains(text(res), `tool "`+tt.tool+`" timed out and was stopped`) {
				t.Errorf("result %q (isError %v); want a timed-out error", clip(text(res)), res.IsError)
			}
			if took > timeout+5*time.Second {
				t.Errorf("a call with a %v timeout took %v", timeout, took)
			}
			// The checks bound how many notifications got through, from
			// above, so late ones must be counted. The host sends them
			// while the call runs, before its result; a ping of each
			// session is answered after everything sent to it before,
			// which its client reads in order.
			for _, cs := range []*mcp.ClientSession{a, sub} {
				if err := cs.Ping(context.Background(), nil); err != nil {
					t.Fatal(err)
				}
			}
			if tt.check != nil {
				tt.check(t, took, floodSeen{
					progress: pl.all(), logs: int(clientLogs.Load()), logBytes: int(clientLogBytes.Load()), updates: int(updates.Load()),
					logged: func(m string) int { return logs.count(m) - before[m] },
				})
			}
			if got := text(call(t, sub, "count", nil)); got != "1" {
				t.Errorf("the subscribed session's first count = %q, want 1", got)
			}
			if tt.ok != "" {
				res = call(t, a, tt.ok, nil)
				if text(res) != "ok" || resetOf(res) != "timeout" {
					t.Errorf("the plugin's next call: %q, stateReset %q; want ok from a fresh instance (timeout)", text(res), resetOf(res))
				}
			}
			if got := text(call(t, a, "count", nil)); got != "1" {
				t.Errorf("the session's first count = %q, want 1", got)
			}
		})
	}
}

// countingWriter counts the bytes and lines of the record log written for
// calls of plugin hostileflood (each Write is one line).
type countingWriter struct {
	bytes, lines atomic.Int64
}

func (w *countingWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"plugin":"hostileflood"`)) {
		w.bytes.Add(int64(len(p)))
		w.lines.Add(1)
	}
	return len(p), nil
}

// TestHostileFloodsAcrossCalls floods by many short calls, from several
// sessions at once, what one call may no longer flood (issue 12): the
// limits per plugin, across its instances and calls, must hold, while a
// second session is served throughout.
func TestHostileFloodsAcrossCalls(t *testing.T) {
	recordLog := &countingWriter{}
	f, logs, errs := newHostileFixture(t, &host.Options{RecordLog: recordLog}, sandbox.NewPolicy().WithCallTimeout(hostileTimeout), map[string]string{
		"counter.wasm":       testplugins.Example(t, "counter"),
		"hostileflood.wasm":  testplugins.Test(t, "hostileflood"),
		"hostileupdate.wasm": testplugins.Test(t, "hostileupdate"),
	}, nil)
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	// manyCalls makes calls of tool from sessions sessions at once, each
	// calling calls times, and returns how long they took.
	manyCalls := func(t *testing.T, tool string, sessions, calls int, copts *mcp.ClientOptions, check func(*mcp.CallToolResult)) time.Duration {
		var css []*mcp.ClientSession
		for range sessions {
			cs := f.connect(t, "2025-11-25", copts)
			if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
				t.Fatal(err)
			}
			css = append(css, cs)
		}
		var took time.Duration
		alongside(t, f, func() {
			start := time.Now()
			var wg sync.WaitGroup
			for _, cs := range css {
				wg.Go(func() {
					for range calls {
						res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}})
						if err != nil {
							t.Errorf("%s: %v", tool, err)
							return
						}
						checkClear(t, res)
						if check != nil {
							check(res)
						}
					}
				})
			}
			wg.Wait()
			took = time.Since(start)
		})
		// The checks bound what got through from above, so late
		// notifications must be counted: a ping of each session is
		// answered after everything sent to it before, which its client
		// reads in order (as in TestHostileTimeouts).
		for _, cs := range css {
			if err := cs.Ping(context.Background(), nil); err != nil {
				t.Fatal(err)
			}
		}
		return took
	}
	t.Run("log_burst", func(t *testing.T) {
		// 60 calls, each sending 20 log messages of 12 000 bytes: 14 MB
		// went to the host log and the clients. A plugin may now send
		// 256 KiB at once, then 64 KiB a second, across its calls.
		var clientBytes atomic.Int64
		copts := &mcp.ClientOptions{LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			s, _ := req.Params.Data.(string)
			clientBytes.Add(int64(len(s)))
		}}
		before := logs.count("plugin log")
		droppedBefore := logs.count("plugin log messages dropped by the rate limit")
		d := manyCalls(t, "log_burst", 3, 20, copts, nil) // its sessions pinged after
		max := floodBound(d, 256<<10, 64<<10) + 12000
		if n := clientBytes.Load(); n < 1 || n > int64(max) {
			t.Errorf("%d bytes of log data reached the clients in %v; want 1 to %d", n, d, max)
		}
		if n := (logs.count("plugin log") - before) * 12000; n > max {
			t.Errorf("%d bytes of log data reached the host log in %v; want at most %d", n, d, max)
		}
		if n := logs.count("plugin log messages dropped by the rate limit") - droppedBefore; n < 1 || n > 60 {
			t.Errorf("%d calls logged their dropped messages; want 1 to 60, once per call", n)
		}
	})
	t.Run("update_burst", func(t *testing.T) {
		// 90 calls, each saying 10 times that flood://item/1 changed: all
		// 900 reached a subscribed session. A plugin may now send 50 at
		// once, then 20 a second, across its calls.
		var updates atomic.Int64
		sub := f.connect(t, "2025-11-25", &mcp.ClientOptions{
			ResourceUpdatedHandler: func(context.Context, *mcp.ResourceUpdatedNotificationRequest) { updates.Add(1); activity.fire() },
		})
		if err := sub.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "flood://item/1"}); err != nil {
			t.Fatal(err)
		}
		d := manyCalls(t, "update_burst", 3, 30, nil, nil)
		if err := sub.Ping(context.Background(), nil); err != nil { // late updates counted too
			t.Fatal(err)
		}
		if n, max := int(updates.Load()), floodBound(d, 50, 20); n < 1 || n > max {
			t.Errorf("%d resource updates reached the subscribed session in %v; want 1 to %d", n, d, max)
		}
		if got := text(call(t, sub, "count", nil)); got != "1" {
			t.Errorf("the subscribed session's first count = %q, want 1", got)
		}
	})
	t.Run("records_burst", func(t *testing.T) {
		// 20 calls, each writing 1 MiB of records (17 of 60 000 bytes):
		// 20 MB went to the record log, and each result carried 1 MB of
		// records past the result cap. A plugin may now write 1 MiB at
		// once, then 64 KiB a second, across its calls, and a result
		// carries what fits within the cap. 8 calls (8 MiB) are past that
		// bound unless they take 100 s (1 s each under -race).
		logBefore := recordLog.bytes.Load()
		linesBefore := recordLog.lines.Load()
		d := manyCalls(t, "records_burst", 1, 8, nil, func(res *mcp.CallToolResult) { checkWire(t, res) })
		max := int64(floodBound(d, 1<<20, 64<<10)) + 60000 + 20*1024
		if n := recordLog.bytes.Load() - logBefore; n > max {
			t.Errorf("%d bytes went to the record log in %v; want at most %d", n, d, max)
		}
		if n := recordLog.lines.Load() - linesBefore; n < 8 {
			t.Errorf("%d calls in the record log; want every call (8)", n)
		}
	})
	eventually(t, "every instance to be freed", func() bool { return f.h.LiveInstances() == 0 })
}

func TestHostileTrapLoop(t *testing.T) {
	f, _, errs := newHostileFixture(t, nil, sandbox.NewPolicy(), map[string]string{
		"counter.wasm": testplugins.Example(t, "counter"),
		"trap.wasm":    testplugins.Test(t, "trap"),
	}, nil)
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	goroutines := runtime.NumGoroutine()
	heap := heapAlloc()
	a := f.connect(t, "", nil)
	const calls = 1000
	alongside(t, f, func() {
		for i := range calls {
			res, err := a.CallTool(context.Background(), &mcp.CallToolParams{Name: "boom", Arguments: map[string]any{}})
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			if !res.IsError || !strings.Contains(text(res), "unreachable") {
				t.Fatalf("call %d: %q (isError %v); want a trap", i, text(res), res.IsError)
			}
			if i > 0 && resetOf(res) != "trap" {
				t.Fatalf("call %d: stateReset %q, want trap", i, resetOf(res))
			}
		}
	})
	if got := text(call(t, a, "calls", nil)); got != "1" {
		t.Errorf("after %d traps: calls = %q, want 1 from a fresh instance", calls, got)
	}
	// The second session's counter instance is freed once the host sees
	// that session end, asynchronously: wait for it.
	eventually(t, "one instance live after the traps (the fresh one)", func() bool { return f.h.LiveInstances() == 1 })
	a.Close()
	eventually(t, "every instance to be freed", func() bool { return f.h.LiveInstances() == 0 })
	eventually(t, "the sessions' goroutines to end", func() bool { return runtime.NumGoroutine() <= goroutines+2 })
	if grown := int64(heapAlloc()) - int64(heap); grown > 16<<20 {
		t.Errorf("the heap grew by %d KiB over %d traps: instances leak", grown>>10, calls)
	}
}

// heapAlloc returns the bytes of live heap objects after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func TestHostileManySessionsAtMemoryLimit(t *testing.T) {
	const limit, sessions = 4 << 20, 20
	f, _, errs := newHostileFixture(t, nil, sandbox.NewPolicy().WithMemoryLimit(limit).WithCallTimeout(hostileSafety), map[string]string{
		"counter.wasm":     testplugins.Example(t, "counter"),
		"hostilegrow.wasm": testplugins.Test(t, "hostilegrow"),
	}, nil)
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	want := "grew to " + strconv.Itoa(limit>>16) + " pages"
	// The baseline: a first grow (a new instance, grown to the limit)
	// alone. The calls at once share the machine's cores, so each may take
	// 20 times the baseline for each session per core, and at least
	// hostileTimeout.
	ws := f.connect(t, "", nil)
	begin := time.Now()
	if got := text(call(t, ws, "grow", nil)); got != want {
		t.Fatalf("grow, alone: %q, want %q", got, want)
	}
	bound := max(hostileTimeout, 20*time.Since(begin)*sessions/time.Duration(runtime.GOMAXPROCS(0)))
	ws.Close()
	clients := make([]*mcp.ClientSession, sessions)
	for i := range clients {
		clients[i] = f.connect(t, "", nil)
	}
	alongside(t, f, func() {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, cs := range clients {
			wg.Go(func() {
				<-start
				began := time.Now()
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "grow", Arguments: map[string]any{}})
				if err != nil || res.IsError || text(res) != want {
					t.Errorf("session %d: grow: %v %q; want %q", i, err, text(res), want)
				}
				if took := time.Since(began); took > bound {
					t.Errorf("session %d: grow took %v (bound %v)", i, took, bound)
				}
			})
		}
		close(start)
		wg.Wait()
	})
	if n := f.h.LiveInstancesByPlugin()["hostilegrow"]; n != sessions {
		t.Errorf("%d instances of hostilegrow live, want %d, each at its limit", n, sessions)
	}
	// Each instance stays at its limit and goes on serving.
	for i, cs := range clients {
		if got := text(call(t, cs, "grow_huge", nil)); got != "refused" {
			t.Errorf("session %d: grow_huge = %q, want refused", i, got)
		}
		if got := text(call(t, cs, "grow", nil)); got != want {
			t.Errorf("session %d: grow again = %q, want %q", i, got, want)
		}
		cs.Close()
	}
	eventually(t, "every instance to be freed", func() bool { return f.h.LiveInstances() == 0 })
}

// TestHostileIdleKernelMemory checks that an idle session holds no more
// host memory than its memory limit allows: docs/ABI.md says all kernel
// memory is freed before each call, so a call that used 15 MiB of it must
// not leave it held while the session idles. (Until de5bfd2 the instance
// kept its kernel memory arena at its largest size, 16 MiB here, for as
// long as the session lived.)
func TestHostileIdleKernelMemory(t *testing.T) {
	const limit, sessions = 1 << 20, 4
	f, _, errs := newHostileFixture(t, nil, sandbox.NewPolicy().WithMemoryLimit(limit).WithCallTimeout(hostileSafety), map[string]string{
		"counter.wasm":       testplugins.Example(t, "counter"),
		"hostileoutput.wasm": testplugins.Test(t, "hostileoutput"),
	}, nil)
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	clients := make([]*mcp.ClientSession, sessions)
	for i := range clients {
		clients[i] = f.connect(t, "", nil)
		call(t, clients[i], "output_ok", nil)
	}
	base := heapAlloc()
	// The first call is the baseline: each later one may take 20 times it,
	// and at least hostileTimeout.
	bound := hostileSafety
	for i, cs := range clients {
		start := time.Now()
		if got := text(call(t, cs, "alloc_most", nil)); got != "filled 15 MiB of kernel memory" {
			t.Fatalf("session %d: alloc_most = %q", i, got)
		}
		took := time.Since(start)
		if took > bound {
			t.Errorf("session %d: alloc_most took %v (bound %v)", i, took, bound)
		}
		if i == 0 {
			bound = max(hostileTimeout, 20*took)
		}
	}
	held := (int64(heapAlloc()) - int64(base)) / sessions
	t.Logf("each idle session holds %d KiB more after a call that used 15 MiB of kernel memory (memory limit %d KiB)", held>>10, limit>>10)
	if held > limit {
		t.Errorf("each idle session holds %d KiB of host memory after its call ended, over its %d KiB memory limit: kernel memory is kept between calls", held>>10, limit>>10)
	}
	for _, cs := range clients {
		cs.Close()
	}
	eventually(t, "every instance to be freed", func() bool { return f.h.LiveInstances() == 0 })
}

// bigModule returns a valid module of about n bytes: a memory and one data
// segment of n bytes, and no exports, so no plugin interface.
func bigModule(n int) []byte {
	uleb := func(v int) []byte {
		var b []byte
		for {
			c := byte(v & 0x7f)
			v >>= 7
			if v != 0 {
				c |= 0x80
			}
			b = append(b, c)
			if v == 0 {
				return b
			}
		}
	}
	section := func(id byte, body []byte) []byte {
		return append(append([]byte{id}, uleb(len(body))...), body...)
	}
	pages := n>>16 + 1
	memory := append([]byte{1, 0}, uleb(pages)...) // one memory, min pages, no max
	data := append([]byte{1, 0, 0x41, 0, 0x0b}, uleb(n)...)
	data = append(data, bytes.Repeat([]byte{0xa5}, n)...) // one active segment at 0
	out := []byte("\x00asm\x01\x00\x00\x00")
	out = append(out, section(5, memory)...)
	return append(out, section(11, data)...)
}

func TestHostileLoadErrors(t *testing.T) {
	const timeout = time.Second
	junk := make([]byte, 24<<20)
	rng := rand.New(rand.NewPCG(6, 6))
	for i := range junk {
		junk[i] = byte(rng.Uint32())
	}
	copy(junk, "\x00asm\x01\x00\x00\x00") // past the magic number check
	start := time.Now()
	f, _, errs := newHostileFixture(t, nil, sandbox.NewPolicy().WithCallTimeout(timeout), map[string]string{
		"counter.wasm":         testplugins.Example(t, "counter"),
		"hostilebigmin.wasm":   testplugins.Test(t, "hostilebigmin"),
		"hostilestart.wasm":    testplugins.Test(t, "hostilestart"),
		"hostileinit.wasm":     testplugins.Test(t, "hostileinit"),
		"hostiledescribe.wasm": testplugins.Test(t, "hostiledescribe"),
	}, map[string][]byte{
		"x.wasm": junk,
		"y.wasm": []byte("This is a text file named like a plugin.\n"),
		"z.wasm": bigModule(20 << 20),
	})
	took := time.Since(start)
	want := map[string][]string{
		"hostilebigmin.wasm":   {"min 1025 pages", "over limit of 1024 pages"},
		"hostilestart.wasm":    {"instantiate", "deadline exceeded"},
		"hostileinit.wasm":     {"_initialize", "deadline exceeded"},
		"hostiledescribe.wasm": {"notify_logging_message", "not available outside an MCP tool call"},
		"x.wasm":               {"compile:"},
		"y.wasm":               {"not a WebAssembly module"},
		"z.wasm":               {"exports neither plugin interface"},
	}
	for file, wants := range want {
		var found string
		for _, err := range errs {
			if strings.Contains(err.Error(), string(filepath.Separator)+file+")") {
				found = err.Error()
			}
		}
		if found == "" {
			t.Errorf("%s: no load error naming the file; errors: %v", file, errs)
			continue
		}
		for _, w := range wants {
			if !strings.Contains(found, w) {
				t.Errorf("%s: load error %q lacks %q", file, found, w)
			}
		}
	}
	if len(errs) != len(want) {
		t.Errorf("%d load errors, want %d: %v", len(errs), len(want), errs)
	}
	// Loading took as long as compiling and refusing 44 MiB takes, which
	// follows the machine's load; TestHostileLoadDeadlines bounds the part
	// the guests can make last.
	t.Logf("loaded in %v", took)
	cs := f.connect(t, "", nil)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 1 || tools.Tools[0].Name != "count" {
		t.Fatalf("tools: %v %v; want count alone", tools, err)
	}
	alongside(t, f, func() {
		if got := text(call(t, cs, "count", nil)); got != "1" {
			t.Errorf("count = %q", got)
		}
	})
}

// TestHostileLoadDeadlines checks that loading waits on each guest that
// never returns (from its start function, from _initialize) for one call
// timeout, one after the other, and on nothing else. The bound follows a
// baseline measured in the same run: loading the counter alone.
func TestHostileLoadDeadlines(t *testing.T) {
	const timeout = time.Second
	policy := sandbox.NewPolicy().WithCallTimeout(timeout)
	load := func(files map[string]string) (time.Duration, []error) {
		start := time.Now()
		_, _, errs := newHostileFixture(t, nil, policy, files, nil)
		return time.Since(start), errs
	}
	counter := testplugins.Example(t, "counter")
	base, errs := load(map[string]string{"counter.wasm": counter})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	took, errs := load(map[string]string{
		"counter.wasm":      counter,
		"hostilestart.wasm": testplugins.Test(t, "hostilestart"),
		"hostileinit.wasm":  testplugins.Test(t, "hostileinit"),
	})
	if len(errs) != 2 {
		t.Fatalf("%d load errors, want 2: %v", len(errs), errs)
	}
	for _, err := range errs {
		if !strings.Contains(err.Error(), "deadline exceeded") {
			t.Errorf("load error %q lacks %q", err, "deadline exceeded")
		}
	}
	// Two guests each stopped at their timeout, over a load of three
	// plugins: 3 × the baseline, 2 timeouts, and slack for a loaded machine.
	if bound := 3*base + 2*timeout + 10*time.Second; took > bound {
		t.Errorf("loading took %v, over %v (the counter alone: %v)", took, bound, base)
	}
	t.Logf("loaded in %v; the counter alone in %v", took, base)
}

// vmStatus reads a field, in bytes, of /proc/self/status.
func vmStatus(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status:", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

func TestHostileRecursion(t *testing.T) {
	f, _, errs := newHostileFixture(t, nil, sandbox.NewPolicy().WithCallTimeout(hostileSafety), map[string]string{
		"counter.wasm":        testplugins.Example(t, "counter"),
		"hostilerecurse.wasm": testplugins.Test(t, "hostilerecurse"),
	}, nil)
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	const sessions = 4
	clients := make([]*mcp.ClientSession, sessions)
	for i := range clients {
		clients[i] = f.connect(t, "", nil)
		call(t, clients[i], "recurse_ok", nil)
	}
	// recurse checks that a deep recursion ends in a stack overflow within
	// bound, and reports how long it took.
	recurse := func(cs *mcp.ClientSession, bound time.Duration) time.Duration {
		start := time.Now()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "recurse", Arguments: map[string]any{}})
		took := time.Since(start)
		if err != nil || !res.IsError || !strings.Contains(text(res), `tool "recurse" crashed (stack overflow)`) {
			t.Errorf("recurse: %v %q; want a stack overflow", err, text(res))
		} else {
			checkClear(t, res)
		}
		if took > bound {
			t.Errorf("recurse took %v; bound %v", took, bound)
		}
		return took
	}
	base := rss(t)
	// The baseline: a recursion alone. The bound of each later one is 20
	// times it, and at least hostileTimeout. What it leaves counts in the
	// RSS checks below.
	alone := recurse(clients[0], hostileSafety)
	bound := max(hostileTimeout, 20*alone)
	t.Logf("a recursion alone took %v: the bound of the others is %v", alone, bound)
	// Writing 5 to clear_refs resets the peak RSS (VmHWM) to the current.
	peakReset := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	// A recursion pauses the whole host once, near its end: wazero copies
	// its call stack (about 42 MB) into a new one of twice the size, and
	// the copy, into pages the kernel has yet to fault in, cannot be
	// preempted, so a garbage collection then waits for it and so does
	// every goroutine that allocates. 250-370 ms on a 2-core machine;
	// seconds under the race detector. The second session's calls may
	// wait that long, never longer than the recursion itself runs.
	alongsideWithin(t, f, max(slowCallFloor, 2*alone), func() { recurse(clients[0], bound) })
	one := vmStatus(t, "VmHWM") - base
	after := rss(t) - base
	if peakReset {
		os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	}
	var wg sync.WaitGroup
	for _, cs := range clients {
		wg.Go(func() { recurse(cs, bound) })
	}
	wg.Wait()
	many := vmStatus(t, "VmHWM") - base
	afterMany := rss(t) - base
	t.Logf("RSS over the baseline: one recursion peaks at %+d MiB and leaves %+d MiB; %d at once peak at %+d MiB and leave %+d MiB (peaks measured: %v)",
		one>>20, after>>20, sessions, many>>20, afterMany>>20, peakReset)
	for _, cs := range clients {
		if res := call(t, cs, "recurse_ok", nil); text(res) != "ok" || resetOf(res) != "trap" {
			t.Errorf("after the recursion: %q, stateReset %q", text(res), resetOf(res))
		}
	}
	if host.RaceEnabled {
		t.Log("RSS under the race detector includes its shadow memory: not checked")
		return
	}
	// The guest's call stack is host memory that no policy limit covers:
	// wazero bounds it (about 50 MB, grown by doubling) and frees it with
	// the instance. The bounds here are generous; see docs/SECURITY.md.
	if peakReset && one > 512<<20 {
		t.Errorf("one deep recursion made the host's RSS peak %d MiB over its baseline", one>>20)
	}
	if after > 64<<20 || afterMany > 64<<20 {
		t.Errorf("after the recursions trapped the host's RSS stayed %d MiB, %d MiB over its baseline", after>>20, afterMany>>20)
	}
	if !peakReset {
		return
	}
	// No policy limit covers the call stack, so concurrent recursions
	// add up; the operator's bound is MaxConcurrentCalls
	// (max_concurrent_calls).
	serial, _, _ := newHostileFixture(t, &host.Options{MaxConcurrentCalls: 1}, sandbox.NewPolicy().WithCallTimeout(hostileSafety), map[string]string{
		"counter.wasm":        testplugins.Example(t, "counter"),
		"hostilerecurse.wasm": testplugins.Test(t, "hostilerecurse"),
	}, nil)
	for i := range clients {
		clients[i] = serial.connect(t, "", nil)
		call(t, clients[i], "recurse_ok", nil)
	}
	base = rss(t)
	os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	for _, cs := range clients {
		wg.Go(func() { recurse(cs, bound) })
	}
	wg.Wait()
	// Freed stacks stay resident until the Go runtime gives them back, so
	// this is logged, not checked.
	t.Logf("with MaxConcurrentCalls 1, %d recursions at once peak at %+d MiB", sessions, (vmStatus(t, "VmHWM")-base)>>20)
}

// TestHostileSchemas: schemas come from the plugin, and the host checks
// values against them: a model's arguments against a tool's input schema,
// a user's answer against a question's requestedSchema. A schema that
// refers to itself in place ("$ref": "#" beside "type": "object") makes a
// validator that follows it recurse without end. The host must refuse such
// a schema, or fail the one call, and serve on. Today (bug) validating
// against it overflows the Go stack, a fatal error that no recover stops:
// the whole host process dies, every session with it. The cases run in
// child processes.
func TestHostileSchemas(t *testing.T) {
	policy := sandbox.NewPolicy().WithCallTimeout(hostileTimeout)
	t.Run("input_schema", func(t *testing.T) {
		if os.Getenv(hostileChild) == "" {
			runIsolated(t)
			return
		}
		f, _, errs := newHostileFixture(t, nil, policy, map[string]string{
			"counter.wasm":       testplugins.Example(t, "counter"),
			"hostileschema.wasm": testplugins.Test(t, "hostileschema"),
		}, nil)
		for _, err := range errs {
			// Refusing the plugin at load, saying why, is a fine answer.
			if !strings.Contains(err.Error(), "selfref") || !strings.Contains(err.Error(), "schema") {
				t.Errorf("load error %q does not name the tool and its schema", err)
			}
		}
		a := f.connect(t, "", nil)
		if len(errs) == 0 {
			alongside(t, f, func() {
				res, err := a.CallTool(context.Background(), &mcp.CallToolParams{Name: "selfref", Arguments: map[string]any{"a": 1}})
				if err == nil && !res.IsError {
					t.Errorf("selfref: %q; want the call refused", text(res))
				}
				t.Logf("selfref: %v %v", err, res)
			})
			if got := text(call(t, a, "schema_ok", nil)); got != "ok" {
				t.Errorf("schema_ok = %q", got)
			}
		}
		if got := text(call(t, a, "count", nil)); got != "1" {
			t.Errorf("count = %q", got)
		}
	})
	// Issue 12: a schema whose validation is exponential in the
	// argument's depth held the host for 15 s past a 5 s call timeout. It
	// is refused at load, with the reason, and the rest is served.
	t.Run("input_schema_cost", func(t *testing.T) {
		f, _, errs := newHostileFixture(t, nil, policy, map[string]string{
			"counter.wasm":         testplugins.Example(t, "counter"),
			"hostilevalidate.wasm": testplugins.Test(t, "hostilevalidate"),
		}, nil)
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), `tool "blowup": input schema: validation could blow up`) {
			t.Fatalf("load errors %v; want blowup's schema refused", errs)
		}
		t.Logf("load error: %v", errs[0])
		a := f.connect(t, "", nil)
		if got := text(call(t, a, "count", nil)); got != "1" {
			t.Errorf("count = %q", got)
		}
	})
	// A client before 2026-07-28 is sent the question: the go-sdk client
	// (v1.8.0) validates its own answer against the schema, and dies. The
	// host must not ask with a schema it cannot check an answer against.
	t.Run("elicitation/protocol=2025-11-25", func(t *testing.T) {
		if os.Getenv(hostileChild) == "" {
			runIsolated(t)
			return
		}
		f := askFixture(t, policy)
		a := f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
		}})
		alongside(t, f, func() {
			res, err := a.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask_selfref", Arguments: map[string]any{}})
			if err != nil {
				t.Fatalf("ask_selfref: %v; want a result", err)
			}
			checkClear(t, res)
			t.Logf("ask_selfref: %q", text(res))
		})
		askAfter(t, a)
	})
	// A 2026-07-28 client answers by retrying the call; the host checks
	// the answer against the schema itself. The client's automatic retry
	// is off, so that the client library does not validate first.
	t.Run("elicitation/protocol=2026-07-28", func(t *testing.T) {
		if os.Getenv(hostileChild) == "" {
			runIsolated(t)
			return
		}
		f := askFixture(t, policy)
		a := f.connect(t, "", &mcp.ClientOptions{
			ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) { return nil, nil },
			MultiRoundTrip:     &mcp.MultiRoundTripOptions{Disabled: true},
		})
		alongside(t, f, func() {
			params := &mcp.CallToolParams{Name: "ask_selfref", Arguments: map[string]any{}}
			res, err := a.CallTool(context.Background(), params)
			if err == nil && res.RequestState != "" {
				// The host asked: answer, as the client would have.
				params.InputResponses = mcp.InputResponseMap{"q": &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}}
				params.RequestState = res.RequestState
				res, err = a.CallTool(context.Background(), params)
			}
			if err != nil {
				t.Fatalf("ask_selfref: %v; want a result", err)
			}
			checkClear(t, res)
			t.Logf("ask_selfref: %q", text(res))
		})
		askAfter(t, a)
	})
}

func askFixture(t *testing.T, policy sandbox.Policy) *fixture {
	t.Helper()
	f, _, errs := newHostileFixture(t, nil, policy, map[string]string{
		"counter.wasm":    testplugins.Example(t, "counter"),
		"hostileask.wasm": testplugins.Test(t, "hostileask"),
	}, nil)
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	return f
}

// askAfter checks that the session goes on after ask_selfref.
func askAfter(t *testing.T, a *mcp.ClientSession) {
	t.Helper()
	if got := text(call(t, a, "ask_ok", nil)); got != "ok" {
		t.Errorf("ask_ok = %q", got)
	}
	if got := text(call(t, a, "count", nil)); got != "1" {
		t.Errorf("count = %q", got)
	}
}
