package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Section is one comparison of the report: the sub-benchmarks of one
// benchmark, grouped by case (every element of the name but the last) and
// compared by contender (the last element).
type Section struct {
	// Title heads the section; Bench is the benchmark's name without
	// "Benchmark".
	Title, Bench string
	// About says what is measured, in Markdown.
	About string
	// Unit is the metric compared; Higher says more is better.
	Unit   string
	Higher bool
	// Throughput, for a time unit, adds the ratio baseline ÷ contender
	// (throughput relative to the baseline) rather than contender ÷
	// baseline.
	Throughput bool
	// Baselines are the contenders every row is compared with, one ratio
	// column each.
	Baselines []string
	// Headline is the contender the summary reports; "" for none, when
	// the Deltas say what the summary should.
	Headline string
	// Extra are further units shown, as medians.
	Extra []string
	// Goal, if not zero, is the least ratio of Headline to Baselines[0]
	// that issue 7 asks for.
	Goal float64
	// CaseGoals are later issues' least ratios of Headline to
	// Baselines[0] in one case each; a case's entry replaces Goal there.
	CaseGoals map[string]float64
	// Deltas compare pairs of contenders of a case by the difference of
	// their figures as well as by their ratio.
	Deltas []Delta
	// Targets are absolute goals for a contender in a case.
	Targets []Target
}

// Target is a later issue's absolute goal for one contender in one case:
// its median at most Max, in the section's unit.
type Target struct {
	Case, Contender string
	Max             float64
	// Label names the target in the summary; About says where it comes
	// from, in Markdown, above its table.
	Label, About string
}

// Delta compares one contender with another in the same case: the ratio
// of their medians (Contender ÷ Against, for a time: how much longer) and
// their difference, which a goal may bound.
type Delta struct {
	Contender, Against string
	// Label names the comparison in the summary; About says what it is,
	// in Markdown, above its table.
	Label, About string
	// Max, if not zero, is the most Contender's median may exceed
	// Against's, in the section's unit (ns for ns/op).
	Max float64
	// MaxRatio, if not zero, is the most Contender's median may be as a
	// multiple of Against's.
	MaxRatio float64
	// GoalCases, if not empty, are the cases Max and MaxRatio apply to;
	// the other cases are shown without a goal.
	GoalCases []string
}

// goalIn says whether d's goals apply in case c.
func (d Delta) goalIn(c string) bool {
	return (d.Max > 0 || d.MaxRatio > 0) && (len(d.GoalCases) == 0 || slices.Contains(d.GoalCases, c))
}

// hasGoal says whether d has a goal in any case.
func (d Delta) hasGoal() bool { return d.Max > 0 || d.MaxRatio > 0 }

// goalText names d's goals: "≤ +10.0 µs", "≤ 1.15×".
func (d Delta) goalText(unit string) string {
	var g []string
	if d.Max > 0 {
		g = append(g, "≤ +"+formatValue(d.Max, unit))
	}
	if d.MaxRatio > 0 {
		g = append(g, fmt.Sprintf("≤ %.2f×", d.MaxRatio))
	}
	return strings.Join(g, ", ")
}

// formatRatio renders a ratio of d's in case c, finer where its goal
// applies and two decimals would show it equal to the goal it misses or
// meets by less (formatRatioAt).
func (d Delta) formatRatio(x float64, c string) string {
	if d.MaxRatio > 0 && d.goalIn(c) {
		return formatRatioAt(x, d.MaxRatio)
	}
	return formatRatio(x)
}

// met says whether x meets d's goals.
func (d Delta) met(x deltaFigures) bool {
	return (d.Max == 0 || x.diff <= d.Max) && (d.MaxRatio == 0 || x.ratio <= d.MaxRatio)
}

// goalFor is the least ratio of Headline to Baselines[0] asked for in
// case c, or 0.
func (s Section) goalFor(c string) float64 {
	if g, ok := s.CaseGoals[c]; ok {
		return g
	}
	return s.Goal
}

// sections are the comparisons of issue 7, in its order, then those of
// later issues.
var sections = []Section{
	{
		Title: "1. New session: first call", Bench: "SessionStart",
		About: "One whole client session: start, first call to the plugin (`small`: the 600-byte WAT counter; `go`: the servlet test plugin, Extism Go PDK, 100-byte input), end. " +
			"`raw-wazero` (the floor), `extism-sdk` and `wasmtools-sandbox` make an instance, call it and close it, with no MCP; " +
			"`native` and `wasmtools` open a go-sdk client session over the in-memory transport to a go-sdk server (a native Go tool handler; wasmtools serving the plugin), make one `tools/call` and close; " +
			"`process-per-session` starts a small native go-sdk server binary, talks MCP to it over stdio, makes one call and waits for it to exit.",
		Unit: "ns/op", Baselines: []string{"raw-wazero", "process-per-session"}, Headline: "wasmtools",
		Targets: []Target{{
			Case: "go", Contender: "wasmtools-sandbox", Max: 1e6,
			Label: "Go session's first call, host side (issue 13)",
			About: "The guest snapshots issue's goal for a new session of the Go plugin, host side (the sandbox: instance, first call, end; no MCP): 1 ms, from 3.98 ms before pre-initialised images. " +
				"The instance starts from the plugin's image (its state after initialisation, Wizer's `wizer.initialize`, which the servlet exports, and the tool listing), on a reservation an ended session freed and the host reset to the image, so that its first call writes no page for the first time (see docs/DESIGN.md).",
		}},
	},
	{
		Title: "2. Warm call through the full MCP stack", Bench: "WarmCall",
		About: "One `tools/call` on a session that has called before (its instance is warm): go-sdk client → transport → go-sdk server → tool → result. " +
			"Transports: the in-memory pair, and streamable HTTP on 127.0.0.1 (protocol 2025-11-25, whose session, Mcp-Session-Id, keeps its instance). " +
			"`native` is the same tool as a native Go handler (`mcp.AddTool`) on a go-sdk server. The ratio is throughput relative to native (native time ÷ wasmtools time); issue 7's goal is ≥ 0.8, issue 27's in memory ≥ 0.9 for the small plugin and ≥ 0.8 for the Go plugin. " +
			"`wasmtools-handle` is the same wasmtools server and plugin for a client of protocol 2026-07-28, which has no sessions: the go-sdk client with default options lists the tools once (so that it mirrors the `wasmtools_session` argument into the `Mcp-Param-Wasmtools-Session` header), makes one untimed call that mints a session handle, then passes the handle back in every call. " +
			"`native-2026` is the native server for a 2026-07-28 client (stateless streamable HTTP, its state keyed by a client header); `native-2026-handle` is the same server keyed by a session argument like wasmtools' (`wasmtools_session`, annotated with `x-mcp-header`, minted on the first call and returned in `_meta`): the baseline of `wasmtools-handle`; `raw-wazero-tool-2026-handle` is that path's floor, the same server and argument with the tool run on plain wazero. " +
			"`raw-wazero-tool` is the floor of any Wasm tool host on the go-sdk: the same plugin's export run by a go-sdk tool handler on plain wazero, an instance per session, with nothing of wasmtools (no deadline or interruption, no validation, no limits, the least Extism kernel; its guest memory outside the Go heap, the guest's input appended, its export called with a stack of its own, its return code checked (a failure is the tool's error) and a text result read without a JSON decoder, as wasmtools' are). Its throughput vs native is the most any host can reach with this guest on this machine; wasmtools' throughput vs raw-wazero-tool is what wasmtools itself keeps of it. " +
			"CPU time per call is the whole process's (client and server share it), which a shared machine disturbs far less than wall time: compare it when the ± column is wide. " +
			"Page faults per call are the process's minor faults over the timed calls (a page written for the first time, or copied on write), each 14 to 20 µs in the VMs measured here: a Go guest's heap takes pages it never touched until its first collections, so a young Go session faults more than one that has run a while (section 4). " +
			"Collections per 1000 calls and the live heap (what the process's last collection before the timed calls ended found live) say how much of that CPU time is the collector's: the go-sdk makes about 390 KB of garbage a call in memory (its JSON decoder's 32 KiB buffers), whoever serves it, and the process collects each time its heap has grown by roughly what it last found live, so the more a contender's sessions hold live, the less often the process collects during its calls (docs/DESIGN.md, \"The collector in the benchmarks\").",
		Unit: "ns/op", Throughput: true, Baselines: []string{"native", "raw-wazero-tool"}, Headline: "wasmtools", Goal: 0.8, Extra: []string{"cpu-ns/op", "faults/op", "gcs/op", "heap-live-MiB"},
		CaseGoals: map[string]float64{"inmemory/small": 0.9, "inmemory/go": 0.8},
		Deltas: []Delta{{
			Contender: "wasmtools-handle", Against: "wasmtools",
			Label: "Warm call with a session handle (2026-07-28)",
			About: "A 2026-07-28 call with a session handle (`wasmtools-handle`) against a call on a stateful HTTP session of protocol 2025-11-25 (`wasmtools`), both over HTTP and on a warm instance kept by the host: the ratio of their times and the difference per call. " +
				"The goal (the session handles issue): a call with a handle costs no more than 10 µs more.",
			Max: 10e3,
		}, {
			Contender: "wasmtools-handle", Against: "wasmtools-header",
			Label: "Cost of the session handle itself (2026-07-28)",
			About: "The same 2026-07-28 path with and without a session handle: `wasmtools-header` keys the client's instance on the operator's client header (`--client-header`) instead, so the difference is what the handle adds: the host reading, checking (HMAC) and removing the argument, and adding the handle to the result; the go-sdk client mirroring the argument into `Mcp-Param-Wasmtools-Session` and the server checking it (SEP-2243). " +
				"The goal applied to the handle alone: no more than 10 µs.",
			Max: 10e3,
		}, {
			Contender: "wasmtools-header", Against: "wasmtools",
			Label: "The 2026-07-28 path without a handle",
			About: "A 2026-07-28 call keyed by the client header (`wasmtools-header`) against a 2025-11-25 call on a stateful session (`wasmtools`): what the go-sdk's sessionless transport costs per request (a server session made and closed for each request, the per-request protocol checks), with no handle involved.",
		}, {
			Contender: "wasmtools-handle", Against: "native-2026-handle",
			Label:    "The 2026-07-28 path with a handle against a native server with one (issue 27)",
			About:    "A 2026-07-28 call with a session handle (`wasmtools-handle`) against the same tool as a native Go handler on a go-sdk server of the same protocol that keeps its state the same way (`native-2026-handle`: stateless streamable HTTP, the only way the go-sdk serves 2026-07-28; the tool takes a `wasmtools_session` argument with the same `x-mcp-header` annotation, keys the counter by it and returns it in `_meta`), so both pay what the go-sdk charges for SEP-2243 header mirroring and the handle's round trip. Issue 27's goal: at most 1.15 times its time.",
			MaxRatio: 1.15,
		}, {
			Contender: "raw-wazero-tool-2026-handle", Against: "native-2026-handle",
			Label: "The floor of the 2026-07-28 path with a handle (issue 27)",
			About: "The floor of any Wasm host on that path (`raw-wazero-tool-2026-handle`: `native-2026-handle`'s stateless server and session argument, the tool declared with the input schema wasmtools lists for it and run on plain wazero as `raw-wazero-tool` runs it, an instance per handle) against the native server with a handle: what this guest costs on that path whoever hosts it. " +
				"Both the go-sdk client and server parse the tool's input schema at every call of this protocol (SEP-2243), so the floor declares the same schema as wasmtools; with a smaller one it would measure a cheaper path.",
		}, {
			Contender: "wasmtools-handle", Against: "raw-wazero-tool-2026-handle",
			Label: "wasmtools against the floor of the 2026-07-28 path with a handle (issue 27)",
			About: "A 2026-07-28 call with a session handle (`wasmtools-handle`) against the same call on the path's floor (`raw-wazero-tool-2026-handle`): what wasmtools itself adds there (the handle's HMAC check, splitting the argument from the plugin's, the schema validation, the deadline, limits and bookkeeping). " +
				"The two processes' live heaps differ (the floor keeps plain wazero's per-instance table of the Go module's data segments, about 0.9 MiB), so the process collects at different rates during each (section 2's collections per 1000 calls).",
		}, {
			Contender: "wasmtools-handle", Against: "native-2026",
			Label: "The 2026-07-28 path against a native server without a handle",
			About: "A 2026-07-28 call with a session handle (`wasmtools-handle`) against the native server of that protocol keyed by a client header (`native-2026`), whose tool has no `x-mcp-header` property: for information only, since the difference includes what the go-sdk charges for SEP-2243 (the row below), which no server with a handle argument escapes.",
		}, {
			Contender: "native-2026-handle", Against: "native-2026",
			Label: "What SEP-2243 header mirroring costs the go-sdk (issue 27)",
			About: "The native 2026-07-28 server with a session argument annotated with `x-mcp-header` (`native-2026-handle`) against the same server keyed by a client header (`native-2026`): what the go-sdk itself charges, client and server, for mirroring the argument into `Mcp-Param-Wasmtools-Session` and checking it, plus the handle's round trip in `_meta`.",
		}, {
			Contender: "native-2026", Against: "native",
			Label: "The go-sdk's own 2026-07-28 cost (issue 27)",
			About: "The native server on the 2026-07-28 path (`native-2026`) against the same server on a stateful 2025-11-25 session (`native`): what the go-sdk's sessionless transport costs a native server per request, which wasmtools pays too.",
		}},
	},
	{
		Title: "3. Memory per idle session", Bench: "IdleSessionMemory",
		About: "Live sessions held at once (see the sessions column), each having made one call and holding its instance; KiB per session. " +
			"In-process contenders: growth of this process's PSS after a GC, over the sessions; `native` and `wasmtools` count both the client and the server side of each go-sdk session, since both live in the benchmark process. " +
			"`process-per-session`: the PSS of every server process (private pages plus its share of pages shared with the others), summed, plus the benchmark process's PSS growth for the client sessions; server-KiB/session is the servers alone. " +
			"PSS counts each page once, shared among the mappings of it; RSS-KiB/session, the same growth in RSS, counts a page once per mapping, so the pages of a Go plugin's pre-initialised image, mapped copy-on-write by every instance, count once per session there though memory holds them once.",
		Unit: "KiB/session", Baselines: []string{"raw-wazero", "process-per-session"}, Headline: "wasmtools", Extra: []string{"RSS-KiB/session", "server-KiB/session", "sessions"},
		Targets: []Target{{
			Case: "go", Contender: "wasmtools", Max: 1024,
			Label: "Idle Go session (issue 13)",
			About: "The guest snapshots issue's goal for an idle session of the Go plugin, client and server side of the go-sdk session included: at most 1 MiB, below a native process per session (4.40 MiB before pre-initialised images). " +
				"Judged on PSS, as process-per-session is; RSS-KiB/session is shown beside it.",
		}},
	},
	{
		Title: "4. Throughput and latency with concurrent sessions", Bench: "ConcurrentSessions",
		About: "N sessions, each with a warm instance, calling the Go plugin's echo (100-byte input) as fast as they get answers, clients and servers on the same cores. " +
			"calls/s is over all sessions; p50 and p99 are one call's latency, client to result. `native`, `wasmtools` and `raw-wazero-tool` sessions use the in-memory transport; `process-per-session` runs one native server process per session, over stdio. `raw-wazero-tool` is section 2's floor of any Wasm host on the go-sdk (the plugin on plain wazero in a go-sdk tool handler, an instance per session, nothing of wasmtools). The ratio is calls/s relative to the baseline; issue 27's goal from 8 to 256 sessions: ≥ 0.85 of native's. CPU time per call is this process's (clients and in-process servers; not process-per-session's server processes), and so are page faults per call (minor faults: a page written for the first time, or copied on write; 14 to 20 µs each in the VMs measured here). " +
			"These are young sessions: each round opens its sessions anew and times 500 ms of calls, hundreds to thousands per session at 1 or 8 sessions but tens at 64 and 256, while a Go guest's heap takes pages it never touched, a fault for each 4 KiB, until its first collections (about 4 MiB of this echo's garbage). wasmtools' guests start from the plugin's pre-initialised image; `raw-wazero-tool`'s start from a fresh instance, which faults more per call in the rounds, so at 64 and 256 sessions its ratio here is its guests' growth as much as its floor. Sessions that have run a while fault far less (docs/DESIGN.md, \"Young and long-lived sessions\"). " +
			"Collections per 1000 calls and the live heap are section 2's: `raw-wazero-tool`'s instances each keep about 0.9 MiB on the Go heap that wasmtools' do not (plain wazero's per-instance table of the Go module's 39,514 data segments, which wasmtools merges when it loads the module), so as sessions are added the process collects less often during the floor's rounds than during wasmtools' and native's. In longer windows that puts the floor above wasmtools at 8 and 64 sessions; with the same inert heap added to the process for both, wasmtools is above the floor (docs/DESIGN.md, \"The collector in the benchmarks\").",
		Unit: "calls/s", Higher: true, Baselines: []string{"native", "raw-wazero-tool", "process-per-session"}, Headline: "wasmtools", Extra: []string{"p50-us", "p99-us", "cpu-ns/op", "faults/op", "gcs/op", "heap-live-MiB"},
		CaseGoals: map[string]float64{"sessions=8": 0.85, "sessions=64": 0.85, "sessions=256": 0.85},
	},
	{
		Title: "5. Hot reload latency", Bench: "ReloadLatency",
		About: "A new version of a plugin renamed into a folder that `wasmtools serve` watches, until a client connected in memory receives `notifications/tools/list_changed`: the 25 ms settle time, compilation (from the on-disk cache: the two versions alternate) and the go-sdk's 10 ms notification debounce included. " +
			"There is no baseline in the same run: hyper-mcp does not reload, and wassette polls every 2 s. Issue 5's bar is 50 ms for a small plugin.",
		Unit: "ms/reload", Headline: "wasmtools",
	},
	{
		Title: "6. Compile and restart", Bench: "Compile",
		About: "`small`, `go`: compile one plugin in a new runtime; `cold` has no compilation cache, `disk-cache` reads the machine code a previous run cached on disk (`--cache-dir`, on by default), `extism-sdk` is the Extism SDK's NewCompiledPlugin (no cache). " +
			"`restart`: a whole server up to ready (new runtime, load, check and list the tools of counter, hash, notes and servlet, host.New), cold and with a warm disk cache.",
		Unit: "ns/op", Baselines: []string{"cold"}, Headline: "disk-cache",
	},
	{
		Title: "7. Per-instance cost, host side (issue 3)", Bench: "NewInstanceFirstCall",
		About: "A new instance of the small (WAT) plugin and its first call, with no MCP: `sandbox` is wasmtools' sandbox (native Extism kernel, limits, deadline); `raw-wazero` the least host code that runs the module; `raw-wazero-termination` the same with wazero's close-on-context-done, the check that let a deadline stop a guest that never calls the host until the sandbox compiled in its own (issue 27, docs/DESIGN.md); `host-session` is a new session's first call through the host (session, slot, limits, instance, call, result), without the MCP transport. " +
			"Issue 3's bar for `host-session`: 100 µs.",
		Unit: "ns/op", Baselines: []string{"raw-wazero-termination", "raw-wazero"}, Headline: "host-session",
	},
	{
		Title: "8. Per-call cost on a warm instance (issue 3)", Bench: "InstanceWarmCall",
		About: "One call with a 100-byte JSON input on a warm instance of the Go plugin (the Extism Go PDK's echo), no MCP. `host-session` adds what a session's call costs the host besides the sandbox: argument validation, the session's instance, result shaping (no MCP transport). The gap between `raw-wazero-termination` and `host-session` is the host's own per-call overhead (issue 3's bar: 5 µs); the gap between the two raw baselines is the price of the termination check on loop-heavy Go guest code. `sandbox-goroutine` is `sandbox` with each call on a goroutine of its own, as the go-sdk runs each request (the difference is waking the other core's thread and growing the new goroutine's stack); `sandbox-gc` is `sandbox` in a process that makes, before each call, the garbage the go-sdk makes per `tools/call` (twelve 32 KiB buffers, about 390 KB), its figure the call's time alone: the same guest code takes longer with the garbage collector working beside it, which is most of what the Go plugin loses inside the server (docs/DESIGN.md, \"The Go guest inside the server\").",
		Unit:  "ns/op", Baselines: []string{"raw-wazero-termination", "raw-wazero"}, Headline: "host-session",
	},
	{
		Title: "9. Memory per idle instance (issue 3)", Bench: "IdleInstanceMemory",
		About: "PSS growth per instance with 1,000 live instances, no MCP (section 3 adds the go-sdk session on both ends, and says why PSS); RSS-KiB/instance is the RSS growth. Issue 3's bar for a small plugin: 150 KiB.",
		Unit:  "KiB/instance", Baselines: []string{"raw-wazero"}, Headline: "sandbox", Extra: []string{"RSS-KiB/instance"},
	},
	{
		Title: "10. Session handle, host side (the session handles issue)", Bench: "HandleOverhead",
		About: "What a 2026-07-28 client's session handle costs the host on one call, without the guest and the transport (sections 2 and 8 have them, where this is lost in their noise): `handle` takes the `wasmtools_session` argument out of 100-byte arguments (a validation and one scan of the object, package `jsonobj`), checks the handle (two HMAC-SHA256, one for the subject's digest, by keyed HMACs kept for reuse) and puts it in the result's `_meta`; `no-handle` is what a call with a session pays on the same path (its arguments are passed through untouched).",
		Unit:  "ns/op", Baselines: []string{"no-handle"}, Headline: "handle",
		Deltas: []Delta{{
			Contender: "handle", Against: "no-handle",
			Label: "Session handle, host side",
			About: "The issue's goal for a call with a handle, applied to what the host adds: no more than 10 µs.",
			Max:   10e3,
		}},
	},
	{
		Title: "11. Guest snapshots (issue 13)", Bench: "Snapshot",
		About: "Host-side snapshots, no MCP, for the small (WAT) plugin and the Go plugin (the Extism Go PDK servlet, 3.4 MiB of memory) after a few calls: `snapshot` saves the instance (the 4 KiB pieces that differ from the initial image, the globals, vars and clocks, compressed with S2 in frames of up to 16 pieces; its size is B/snapshot) again, with nothing changed since its previous snapshot, so every frame is reused, and pages not written since the previous snapshot are not even read (the kernel's write tracking says which were, on Linux 6.10 and later where a page fault is cheap enough for it to pay; else pagemap says which were never written, and the rest are hashed); `snapshot-after-call` makes one more call (untimed) before each snapshot, as a durable session's checkpoint does, so the pieces that call wrote are compressed anew, together (the servlet's remembered list grows with each call, and so does its snapshot); `restore` starts a new instance from it, on the plugin's pre-initialised image (a reservation an ended instance freed, reset to the image), writing only the 4 KiB pieces whose bytes differ from the image's. " +
			"The raw baselines are the floors they stand against: `raw-wazero-copy` copies the whole linear memory out of a raw wazero instance; `raw-wazero-new` is a new raw wazero instance with its initialisation run, which a restore replaces.",
		Unit: "ns/op", Baselines: []string{"raw-wazero-new", "raw-wazero-copy"}, Headline: "restore", Extra: []string{"B/snapshot"},
	},
	{
		Title: "12. Durable sessions (issue 16)", Bench: "DurableCall",
		About: "What keeping sessions in a state store costs: a checkpoint at every call, and the first call of a session on a replica that did not serve it before. " +
			"Every call is a warm `tools/call` over streamable HTTP on 127.0.0.1 on a stateful session (protocol 2025-11-25), of a tool that changes its instance's state (`small`: the counter's `count`; `go`: the servlet's `var_count`, an Extism var), so that every call writes a checkpoint (the default policy: after each call, before the result is sent). " +
			"`no-store` is the host without a store, the baseline (section 2's HTTP `wasmtools` with these tools); " +
			"`redis` keeps sessions in a real redis-server on loopback, `file` in the file store (bbolt, an fsync per write): each call writes the instance's saved state (section 11's snapshot, sealed) under the session's fence, which checks that this replica's claim is current: both plugins are contained (no host function of the host's own, no grant), so that write is the call's only exchange with the store; a plugin that is not is claimed again before each call too (docs/DESIGN.md, \"Why check the claim before a request, and after it for a contained call?\"). " +
			"`redis-wait` is `redis` with a replica of the store's, every write waiting for it (`wait_replicas=1`: Redis's `WAIT` after the write, on its connection, so that a failover to the replica loses no write a result was sent for; docs/DEPLOY.md, \"Redis with replicas\"): a primary and replica of their own, on the same loopback. " +
			"`redis-aged` (the Go plugin only) is `redis` on a session that made 3,000 calls first, untimed: a Go guest's runtime makes more and more of its memory its own until its first collections, so an older session's snapshot has more pieces to tell the written ones from (docs/DESIGN.md, \"sandbox: snapshots\", write tracking per instance), and its record more frames. " +
			"`adopt` is the first call at replica B of a session whose two earlier calls ran at replica A, the two sharing the Redis store, after A drained (a rolling restart: its instances saved, its claims released, the host closed) and the client's transport points at B: B reads the session's record, replays its initialize, claims it, restores the instance from its saved state, runs the call (whose count must go on from A's) and writes its checkpoint. " +
			"`adopt-killed` is the same after A is gone as a replica killed (its listener closed, the host closed without a drain, its sessions still claimed): B's claim waits out A's lease on the store's clock (2.5 s, `statestore.Lease`), which is what keeps a stopped replica's 2 s of serving from memory sound (docs/DEPLOY.md, guarantees), so it is that wait plus `adopt`'s work. " +
			"`first-call-no-store` is the first call of a new session on the host without a store, which makes the session's instance: what the client of a replica that died would pay with no store, its state lost. " +
			"`adopt`, `adopt-killed` and `first-call-no-store` open a new session for each call, untimed and without the standalone SSE stream (a reconnecting stream would take the session over before the call). " +
			"B/checkpoint is the mean size of what a checkpoint writes, before sealing (a binary record: a short JSON head, then section 11's snapshot raw, or, for a snapshot of 16 KiB or more, the frames the call changed and a reference to each of the others, in a base written beside it now and then: docs/DESIGN.md, \"Checkpoints write what changed\"; the base's writes included); store write is the mean time of its write (sealing and the store's put, not the snapshot nor the claim), from the host's metrics; Redis CPU is the CPU time redis-server used per call (its `INFO cpu`, user and system, before and after the calls): the store's own work, which on a machine of two cores is taken from the host and its client, apart from the time the host waited for it.",
		Unit: "ns/op", Baselines: []string{"no-store", "first-call-no-store"}, Extra: []string{"B/checkpoint", "write-us", "redis-cpu-us"},
		Deltas: []Delta{{
			Contender: "redis", Against: "no-store",
			Label: "Checkpoint per call, Redis (issue 16)",
			About: "A warm call with its checkpoint in Redis against the same call with no store: the difference is the checkpoint's cost per call (the state saved, sealed and written under the fence, which checks the claim). Issue 27's goal for the Go plugin: at most +0.5 ms.",
			Max:   0.5e6, GoalCases: []string{"go"},
		}, {
			Contender: "redis-wait", Against: "redis",
			Label: "Waiting for a replica's acknowledgment (wait_replicas=1)",
			About: "A checkpoint in Redis that waits for a replica to have it, against one that does not: what the failover guarantee costs per call.",
		}, {
			Contender: "redis-aged", Against: "no-store",
			Label: "Checkpoint per call, Redis, a session 3,000 calls old (issue 27)",
			About: "The same on a session that made 3,000 calls first: what the checkpoint costs once a Go guest's heap has spread. Issue 27's goal: at most +0.5 ms.",
			Max:   0.5e6, GoalCases: []string{"go"},
		}, {
			Contender: "file", Against: "no-store",
			Label: "Checkpoint per call, file (issue 16)",
			About: "The same with the file store, whose every write is a bbolt transaction with an fsync.",
		}, {
			Contender: "adopt", Against: "no-store",
			Label: "Adoption against a warm call (issue 16)",
			About: "The first call of a session taken over from the store, against a warm call on the replica that holds the session: what a client pays once when its replica drains.",
		}, {
			Contender: "adopt-killed", Against: "adopt",
			Label: "Adoption after a replica is killed (issue 25)",
			About: "The first call of a session whose replica was killed, holding it, against one whose replica drained: the killed replica's lease (2.5 s) waited out, what a client pays once when its replica dies.",
		}, {
			Contender: "adopt", Against: "first-call-no-store",
			Label: "Adoption against a new session's first call (issue 16)",
			About: "The same first call against that of a new session without a store, which also makes an instance but has no state to read, claim or restore.",
		}},
	},
	{
		Title: "13. Compute-heavy Go plugin (issue 27)", Bench: "ComputeCall",
		About: "A warm call of a tool that spends its time in the guest: the test plugin `compute` (ordinary Go, the standard toolchain and the Extism Go PDK), whose `crunch` builds 1 000 records, counts their words in a map, encodes them as JSON and decodes them back, sorts them and hashes the result (SHA-256, 65 rounds). " +
			"`raw-wazero` runs the module on plain wazero with no termination check (nothing could stop it) and the least Extism kernel: the floor; `raw-wazero-check` adds wazero's close-on-context-done; `sandbox` is wasmtools' sandbox, whose modules carry the host's own interruption check (docs/DESIGN.md, \"Why interrupt guests with a flag of our own\"); `sandbox-wazero-check` the sandbox with wazero's check instead (the fallback setting); `wasmtools` the full MCP stack in memory. " +
			"The unit is the CPU time of the whole process per call (every thread: guest, host, garbage collector), steadier than wall time (ns/op, shown) on a shared machine. Issue 27's goal: `wasmtools` at most 1.3 times `raw-wazero`.",
		Unit: "cpu-ns/op", Baselines: []string{"raw-wazero", "raw-wazero-check"}, Headline: "wasmtools", Extra: []string{"ns/op"},
		Deltas: []Delta{{
			Contender: "wasmtools", Against: "raw-wazero",
			Label:    "Compute-heavy Go plugin against wazero without a check (issue 27)",
			About:    "The full MCP stack with the host's own interruption against the same module on plain wazero, which nothing could stop: issue 27's goal is at most 1.3 times its CPU time.",
			MaxRatio: 1.3,
		}},
	},
	{
		Title: "15. Traces on and off (issue 29)", Bench: "TracedCall",
		About: "Section 2's in-memory warm call of each plugin with tracing off (no `OTEL_*` exporter: what wasmtools runs with by default; the request middleware makes one atomic load and calls through, `telemetry.On`) and on (the OpenTelemetry SDK's provider, every span sampled, a batch processor whose exporter discards: the cost in wasmtools, not in a collector). " +
			"On, each call makes its spans (the request, the slot wait, the guest's run, and the guest's HTTP requests if any) with their attributes. Allocation counts are exact whatever the machine's load.",
		Unit: "ns/op", Baselines: []string{"traces-off"}, Headline: "traces-on", Extra: []string{"allocs/op", "B/op"},
	},
}

// Env is where and when the benchmarks ran.
type Env struct {
	Machine, GoVersion, Date string
}

// split returns a benchmark name's case and contender.
func split(name string) (string, string) {
	i := strings.LastIndex(name, "/")
	if i < 0 {
		return "", name
	}
	return name[:i], name[i+1:]
}

// row is one contender in one case of a section.
type row struct {
	name, cas, who string
}

func (s Section) rows(r *Results) (cases []string, rows map[string][]row) {
	rows = map[string][]row{}
	for _, name := range r.Names {
		rest, ok := strings.CutPrefix(name, s.Bench+"/")
		if !ok || r.Runs(name, s.Unit) == 0 {
			continue
		}
		cas, who := split(rest)
		if _, seen := rows[cas]; !seen {
			cases = append(cases, cas)
		}
		rows[cas] = append(rows[cas], row{name, cas, who})
	}
	return cases, rows
}

// ratio compares a contender with a baseline in the section's terms.
// The ratio is the median of each round's (Results.Paired).
func (s Section) ratio(r *Results, name, base string) (float64, bool) {
	if !r.nonzero(name, s.Unit) || !r.nonzero(base, s.Unit) {
		return 0, false
	}
	return r.Paired(name, base, s.Unit, func(v, b float64) float64 {
		if s.Throughput {
			return b / v
		}
		return v / b
	})
}

func (s Section) ratioHeader(base string) string {
	if s.Throughput {
		return "throughput vs " + base
	}
	return "÷ " + base
}

// Markdown renders the report.
func Markdown(r *Results, env Env, chart string) string {
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	p("# Benchmarks\n\n")
	p("wasmtools beside the alternatives its users have, measured on the same machine in the same run (issue 7). ")
	p("Each figure is the median of the runs shown; ± is half their range, relative to the median. ")
	p("The machines are shared and noisy, so absolute times drift between runs: read the ratios, which are taken within one run, and, where both contenders ran in the same rounds, within each round: a ratio or a difference between two contenders is the median of those of each round, so it need not equal the ratio of the two medians shown. ")
	p("A ratio `÷ X` is the contender's figure divided by X's (for times and memory, lower is better); `throughput vs X` and calls/s ratios are higher-is-better.\n\n")
	p("- Machine: %s\n- Go: %s\n- Date: %s\n\n", env.Machine, env.GoVersion, env.Date)
	p("Reproduce with `make bench` (15 to 20 minutes on 2 cores): it builds the plugins, runs the benchmarks of package `bench` and regenerates this file and [benchmarks.png](benchmarks.png) with `bench/cmd/benchreport`. ")
	p("The timed benchmarks run in rounds (`bench/run.sh`): every round runs each of them once, so that a contender and its baseline are measured close in time in every round, and a slow minute on the machine falls on both rather than on one of them. The commands it ran:\n\n```sh\n")
	for _, c := range r.Commands {
		p("%s\n", c)
	}
	if len(r.Commands) == 0 {
		p("make bench\n")
	}
	p("```\n\n")
	if chart != "" {
		p("![Session start cost and memory per idle session, wasmtools and the alternatives (log scales)](%s)\n\n", chart)
		p("The chart shows sections 1 and 3. For the native and process-per-session bars, \"small plugin\" and \"Go plugin\" mean the native twin of each plugin's tool (`count`, `echo`).\n\n")
	}

	p("## Summary\n\n| measure | case | %s | compared |\n|---|---|---|---|\n", "figure")
	for _, s := range sections {
		cases, rows := s.rows(r)
		for _, c := range cases {
			if s.Headline == "" {
				break
			}
			head := s.Bench + "/" + joinCase(c, s.Headline)
			v, ok := r.Median(head, s.Unit)
			if !ok {
				continue
			}
			var cmp []string
			for _, b := range s.Baselines {
				if b == s.Headline || !hasRow(rows[c], b) {
					continue
				}
				if x, ok := s.ratio(r, head, s.Bench+"/"+joinCase(c, b)); ok {
					txt := fmt.Sprintf("%s %s", formatRatio(x), s.ratioHeader(b))
					if g := s.goalFor(c); g > 0 && b == s.Baselines[0] {
						txt = fmt.Sprintf("%s %s", formatRatioAt(x, g), s.ratioHeader(b)) + goalNote(x, g)
					}
					cmp = append(cmp, txt)
				}
			}
			fig := formatValue(v, s.Unit)
			if s.Unit == "calls/s" {
				fig += " calls/s"
			}
			p("| %s | %s | %s: %s | %s |\n", strings.TrimLeft(s.Title, "0123456789. "), caseLabel(c), s.Headline, fig, strings.Join(cmp, ", "))
		}
		for _, tg := range s.Targets {
			if v, ok := r.Median(s.Bench+"/"+joinCase(tg.Case, tg.Contender), s.Unit); ok {
				p("| %s | %s | %s: %s | goal ≤ %s: %s |\n", tg.Label, caseLabel(tg.Case), tg.Contender, formatValue(v, s.Unit), formatValue(tg.Max, s.Unit), metOrNot(v <= tg.Max))
			}
		}
		for _, d := range s.Deltas {
			for _, c := range cases {
				x, ok := s.delta(r, d, c)
				if !ok {
					continue
				}
				txt := fmt.Sprintf("%s ÷ %s, %s", d.formatRatio(x.ratio, c), d.Against, formatDiff(x.diff, s.Unit))
				if d.goalIn(c) {
					txt += fmt.Sprintf(" (goal %s: %s)", d.goalText(s.Unit), metOrNot(d.met(x)))
				}
				p("| %s | %s | %s: %s | %s |\n", d.Label, caseLabel(c), d.Contender, formatValue(x.v, s.Unit), txt)
			}
		}
	}
	p("\n")

	for _, s := range sections {
		p("## %s\n\n%s\n\n", s.Title, s.About)
		cases, rows := s.rows(r)
		if len(cases) == 0 {
			p("No results in this run.\n\n")
			continue
		}
		hdr := []string{"case", "contender", s.Unit, "±"}
		for _, b := range s.Baselines {
			hdr = append(hdr, s.ratioHeader(b))
		}
		for _, u := range s.Extra {
			hdr = append(hdr, unitHeader(u))
		}
		p("| %s |\n|%s\n", strings.Join(hdr, " | "), strings.Repeat("---|", len(hdr)))
		for _, c := range cases {
			for _, row := range rows[c] {
				v, _ := r.Median(row.name, s.Unit)
				cells := []string{caseLabel(c), row.who, formatValue(v, s.Unit), formatSpread(r, row.name, s.Unit)}
				for _, b := range s.Baselines {
					if !hasRow(rows[c], b) {
						cells = append(cells, "")
						continue
					}
					x, ok := s.ratio(r, row.name, s.Bench+"/"+joinCase(c, b))
					if !ok {
						cells = append(cells, "")
						continue
					}
					cells = append(cells, formatRatio(x))
				}
				for _, u := range s.Extra {
					if e, ok := r.Median(row.name, u); ok {
						cells = append(cells, formatValue(e, u))
					} else {
						cells = append(cells, "")
					}
				}
				if row.who == s.Headline {
					cells[1] = "**" + cells[1] + "**"
				}
				p("| %s |\n", strings.Join(cells, " | "))
			}
		}
		p("\n")
		for _, tg := range s.Targets {
			s.targetTable(p, r, tg)
		}
		for _, d := range s.Deltas {
			s.deltaTable(p, r, d, cases)
		}
	}

	p("## Raw results\n\n<details><summary>The result lines, as `go test -bench` printed them (this file can be fed back to benchreport)</summary>\n\n```\n")
	if r.CPU != "" {
		p("cpu: %s\n", r.CPU)
	}
	for _, l := range r.Lines {
		p("%s\n", l)
	}
	p("```\n\n</details>\n")
	return w.String()
}

// deltaFigures are a Delta's figures in one case.
type deltaFigures struct {
	v, against  float64 // the medians
	ratio, diff float64 // v ÷ against, v − against, in each round (their medians)
}

// delta computes d in case c, if both contenders ran.
func (s Section) delta(r *Results, d Delta, c string) (deltaFigures, bool) {
	name, base := s.Bench+"/"+joinCase(c, d.Contender), s.Bench+"/"+joinCase(c, d.Against)
	v, ok1 := r.Median(name, s.Unit)
	a, ok2 := r.Median(base, s.Unit)
	if !ok1 || !ok2 || !r.nonzero(base, s.Unit) {
		return deltaFigures{}, false
	}
	// The ratio and the difference are each round's, their median
	// (Results.Paired); v and against are the medians shown beside them.
	ratio, _ := r.Paired(name, base, s.Unit, func(v, b float64) float64 { return v / b })
	diff, _ := r.Paired(name, base, s.Unit, func(v, b float64) float64 { return v - b })
	return deltaFigures{v: v, against: a, ratio: ratio, diff: diff}, true
}

// deltaTable renders d's table, for the cases where both contenders ran.
func (s Section) deltaTable(p func(string, ...any), r *Results, d Delta, cases []string) {
	var rows []string
	for _, c := range cases {
		x, ok := s.delta(r, d, c)
		if !ok {
			continue
		}
		cells := []string{caseLabel(c), formatValue(x.v, s.Unit), formatValue(x.against, s.Unit), d.formatRatio(x.ratio, c), formatDiff(x.diff, s.Unit)}
		switch {
		case d.goalIn(c):
			cells = append(cells, metOrNot(d.met(x)))
		case d.hasGoal():
			cells = append(cells, "")
		}
		rows = append(rows, "| "+strings.Join(cells, " | ")+" |\n")
	}
	if len(rows) == 0 {
		return
	}
	p("**%s against %s.** %s\n\n", d.Contender, d.Against, d.About)
	hdr := []string{"case", d.Contender, d.Against, "÷ " + d.Against, "difference"}
	if d.hasGoal() {
		hdr = append(hdr, "goal "+d.goalText(s.Unit))
	}
	p("| %s |\n|%s\n", strings.Join(hdr, " | "), strings.Repeat("---|", len(hdr)))
	for _, row := range rows {
		p("%s", row)
	}
	p("\n")
}

// targetTable renders tg's table, if its contender ran.
func (s Section) targetTable(p func(string, ...any), r *Results, tg Target) {
	v, ok := r.Median(s.Bench+"/"+joinCase(tg.Case, tg.Contender), s.Unit)
	if !ok {
		return
	}
	p("**%s.** %s\n\n", tg.Label, tg.About)
	p("| case | contender | %s | goal | |\n|---|---|---|---|---|\n", s.Unit)
	p("| %s | %s | %s | ≤ %s | %s |\n\n", caseLabel(tg.Case), tg.Contender, formatValue(v, s.Unit), formatValue(tg.Max, s.Unit), metOrNot(v <= tg.Max))
}

// formatDiff renders a signed difference of two figures of unit.
func formatDiff(d float64, unit string) string {
	if d < 0 {
		return "−" + formatValue(-d, unit)
	}
	return "+" + formatValue(d, unit)
}

func metOrNot(met bool) string {
	if met {
		return "met"
	}
	return "not met"
}

// unitHeader heads a column of a unit.
func unitHeader(unit string) string {
	switch unit {
	case "p50-us":
		return "p50 latency"
	case "p99-us":
		return "p99 latency"
	case "server-KiB/session":
		return "servers only, per session"
	case "RSS-KiB/session":
		return "RSS per session"
	case "RSS-KiB/instance":
		return "RSS per instance"
	case "write-us":
		return "store write"
	case "redis-cpu-us":
		return "Redis CPU"
	case "cpu-ns/op":
		return "CPU time per call"
	case "faults/op":
		return "page faults per call"
	case "gcs/op":
		return "collections per 1000 calls"
	case "heap-live-MiB":
		return "live heap"
	case "ns/op":
		return "wall time per call"
	}
	return unit
}

func joinCase(c, who string) string {
	if c == "" {
		return who
	}
	return c + "/" + who
}

func hasRow(rows []row, who string) bool {
	return slices.ContainsFunc(rows, func(r row) bool { return r.who == who })
}

// caseLabel names a case for readers.
func caseLabel(c string) string {
	switch {
	case c == "small":
		return "small plugin"
	case c == "go":
		return "Go plugin"
	case c == "sessions=1":
		return "1 session"
	case strings.HasPrefix(c, "sessions="):
		return strings.TrimPrefix(c, "sessions=") + " sessions"
	}
	c = strings.Replace(c, "/small", ", small plugin", 1)
	c = strings.Replace(c, "/go", ", Go plugin", 1)
	c = strings.Replace(c, "inmemory", "in-memory", 1)
	c = strings.Replace(c, "http", "HTTP", 1)
	return c
}

func goalNote(x, goal float64) string {
	return fmt.Sprintf(" (goal ≥ %s: %s)", strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", goal), "0"), "."), metOrNot(x >= goal))
}

func formatSpread(r *Results, name, unit string) string {
	s, ok := r.Spread(name, unit)
	if !ok {
		return ""
	}
	return fmt.Sprintf("±%.0f%%", 100*s)
}

// formatRatioAt is formatRatio of x beside a goal: with a third decimal
// when two would show x as the goal itself, so that "1.15×, not met"
// never stands for 1.153.
func formatRatioAt(x, goal float64) string {
	if x == goal || formatRatio(x) != formatRatio(goal) {
		return formatRatio(x)
	}
	for prec := 3; prec < 6; prec++ {
		if f := fmt.Sprintf("%.*f×", prec, x); f != fmt.Sprintf("%.*f×", prec, goal) {
			return f
		}
	}
	return fmt.Sprintf("%.6f×", x)
}

func formatRatio(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	case x >= 10:
		return fmt.Sprintf("%.1f×", x)
	case x >= 0.01:
		return fmt.Sprintf("%.2f×", x)
	default:
		return fmt.Sprintf("%.4f×", x)
	}
}

// formatValue renders a metric for readers: times with a unit that fits,
// KiB as KiB or MiB, rates as whole numbers.
func formatValue(v float64, unit string) string {
	switch unit {
	case "ns/op", "cpu-ns/op":
		return formatDuration(v)
	case "p50-us", "p99-us", "write-us", "redis-cpu-us":
		return formatDuration(v * 1e3)
	case "KiB/session", "server-KiB/session", "RSS-KiB/session", "RSS-KiB/instance":
		if v >= 1024 {
			return sig3(v/1024) + " MiB"
		}
		return sig3(v) + " KiB"
	case "calls/s":
		return fmt.Sprintf("%.0f", v)
	case "faults/op":
		return fmt.Sprintf("%.2f", v)
	case "gcs/op":
		return fmt.Sprintf("%.1f", v*1000)
	case "heap-live-MiB":
		return sig3(v) + " MiB"
	case "sessions":
		return fmt.Sprintf("%.0f", v)
	}
	return sig3(v) + " " + unit
}

func formatDuration(ns float64) string {
	switch {
	case ns >= 1e9:
		return sig3(ns/1e9) + " s"
	case ns >= 1e6:
		return sig3(ns/1e6) + " ms"
	case ns >= 1e3:
		return sig3(ns/1e3) + " µs"
	}
	return sig3(ns) + " ns"
}

// sig3 formats v with three significant digits (more for large integers).
func sig3(v float64) string {
	if v == 0 {
		return "0"
	}
	d := 2 - int(math.Floor(math.Log10(math.Abs(v))))
	if d < 0 {
		d = 0
	}
	return fmt.Sprintf("%.*f", d, v)
}
