package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/wasmtools/wasmtools/host"
	wauth "github.com/wasmtools/wasmtools/internal/auth"
	"github.com/wasmtools/wasmtools/internal/config"
	"github.com/wasmtools/wasmtools/internal/grantstore"
	"github.com/wasmtools/wasmtools/internal/sources"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// connStateHook, when set, sees every state change of the HTTP server's
// connections: the tests' signal that the server accepted or closed a
// connection (net/http gives no other). Nil in production.
var connStateHook atomic.Pointer[func(net.Conn, http.ConnState)]

// configWatchHook, when set, is called as the configuration's watch
// begins, before it is set up: a test's edit that no event will report.
// Nil in production.
var configWatchHook atomic.Pointer[func()]

func cmdServe(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var common commonFlags
	common.register(fs)
	var srcFlags sourceFlags
	srcFlags.register(fs, &common)
	httpAddr := fs.String("http", "", "serve streamable HTTP at ADDR/mcp (for example 127.0.0.1:8080) instead of stdio")
	sessionTimeout := fs.Duration("session-timeout", host.DefaultSessionTimeout, "close HTTP sessions idle this long (0: never)")
	streamKeepAlive := fs.Duration("stream-keepalive", host.DefaultStreamKeepAlive, "write a comment on an HTTP event stream silent this long, so that a proxy's read timeout tells a hung replica from a long call (0: never)")
	streamWriteTimeout := fs.Duration("stream-write-timeout", host.DefaultStreamWriteTimeout, "end an HTTP response, a client's event stream, whose write (of each 64 KiB) has not gone through in this long: a client that stops reading holds up no one's notifications (0: never)")
	maxResult := fs.Int("max-result", host.DefaultMaxResultRunes, "cap each tool result at this many characters (0: no cap)")
	maxInstances := fs.Int("max-instances", 0, "at most this many live plugin instances; the least recently used idle one is evicted (0: no bound)")
	maxPerPlugin := fs.Int("max-instances-per-plugin", 0, "at most this many live instances of any one plugin (0: no bound)")
	deriveHeader := fs.Bool("derive-session-header", false, "fill in a 2026-07-28 call's missing Mcp-Param-Wasmtools-Session header from its session argument (for clients that dropped their tool cache after list_changed); off: refused, as MCP 2026-07-28 says")
	clientHeader := fs.String("client-header", "", "HTTP header that identifies a client on sessionless (2026-07-28) requests, so its calls share instances instead of getting session handles; not authentication")
	handleNote := fs.Bool("handle-note", true, "tell the model, in a note after a result, the session handle minted for a 2026-07-28 client (the handle is in the result's _meta either way)")
	maxSessions := fs.Int("max-sessions", 0, "at most this many open stateful HTTP sessions (Mcp-Session-Id); past it a new one ends an idle session, or is refused (0: 4096)")
	maxConns := fs.Int("max-connections", 0, "at most this many HTTP connections open at once; one past it is answered 503 and closed as it is accepted (0: http.max_connections, else twice --max-sessions and 1024, 9216 by default: a standing stream for each session and the connection its client's requests take beside it, and room for calls in flight)")
	maxHandles := fs.Int("max-handles", 0, "at most this many open session handles of 2026-07-28 clients, and apart --client-header clients; past it an idle one is ended, handles never passed back first (0: 1000)")
	recordLog := fs.String("record-log", "", "append one JSON line per tool call (with the records it wrote) to FILE")
	recordLogMax := fs.String("record-log-max", defaultRecordLogMax, "rotate the record log at this size, keeping the previous one as FILE.1 (0: never)")
	maxParked := fs.Int("max-parked", 0, "at most this many calls parked for a 2026-07-28 client's answer (0: 256)")
	maxParkedPerClient := fs.Int("max-parked-per-client", 0, "at most this many parked calls per client (0: 4)")
	abandonAfter := fs.Duration("abandon-after", host.DefaultAbandonAfter, "stop a call waiting for a 2026-07-28 client's answer after this long")
	loadWait := fs.Duration("load-wait", host.DefaultLoadWait, "at start, a request that reads the catalogue waits this long for the plugins' first load (they are served as each loads)")
	noWatch := fs.Bool("no-watch", false, "do not watch the plugin folders: serve what is there at start")
	prepare := fs.Bool("prepare", false, "do not serve: load every plugin as serving would (remote sources fetched into --source-dir, machine code compiled into --cache-dir), print what would be served, and exit (1 if a plugin failed): for a container image's build, or before a one-shot client's first run")
	shutdownGrace := fs.Duration("shutdown-grace", 10*time.Second, "on shutdown, wait this long for calls in flight")
	replica := fs.String("replica", "", "this replica's NAME among replicas behind a proxy: session IDs and handles begin with NAME. (see docs/DEPLOY.md)")
	stateStore := fs.String("state-store", "", "keep sessions and their plugins' states in a store, so that they survive a restart or move to another replica: redis://HOST:PORT/DB (?wait_replicas=N: a write is acknowledged once N replicas have it), redis://SENTINEL:PORT/DB?master_name=NAME (the primary Sentinel names), file:PATH, or file (a file under the state directory)")
	checkpoint := fs.String("checkpoint", host.CheckpointAfterCall, "when instance states are written to the state store: after-call (each call that changed one, before its result) or drain")
	drainDelay := fs.Duration("drain-delay", 0, "on SIGTERM or POST /drain, keep serving open sessions this long after /readyz fails, for the proxy to notice (default with --replica: 1s, two of HAProxy's health checks in deploy/haproxy.cfg)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: wasmtools serve [flags] PATH|SOURCE...\n\nServes every .wasm plugin in the folders and files given, over MCP on stdio\n(or streamable HTTP with --http). A plugin that fails to load is logged\nand skipped; the rest are served.\n\nA SOURCE is a remote plugin, [NAME=]oci://REGISTRY/REPO:TAG (or @sha256:DIGEST)\nor [NAME=]https://URL: fetched, verified (an OCI plugin's cosign signature\nagainst --public-key; an HTTPS plugin's sha256 pin from --config) and\nstored by digest under --source-dir.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return flagsExit(err)
	}
	// Log lines and the pull progress bars share the terminal: a log line
	// clears the bar's line before it is written (progressUI).
	ui := newProgressUI(stderr)
	log := newLogger(ui, common.verbose)
	ui.log = log
	// SIGHUP is caught from here until every deferred cleanup has run (the
	// link folder's removal is the first deferred): a SIGHUP during the
	// shutdown would otherwise kill the process midway.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ctx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	interactive := isTerminal(stdin)
	// Traces, when the OTEL_* variables name an exporter (off otherwise).
	traces, flushTraces, err := telemetry.Setup(ctx, func(k string) string { v, _ := lookupEnv(k); return v }, "wasmtools", version())
	if err != nil {
		log.Error("tracing refused", "error", err)
		return 1
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := flushTraces(ctx); err != nil {
			log.Warn("tracing: spans not flushed at exit", "error", err)
		}
	}()
	if traces.Enabled {
		log = slog.New(telemetry.LogHandler(log.Handler()))
		log.Info("tracing on: OTLP over HTTP", "endpoint", traces.Endpoint)
	}
	local := srcFlags.splitArgs(fs.Args())
	if fs.NArg() == 0 && common.configPath == "" && common.hyperPath == "" {
		fmt.Fprintln(stderr, "wasmtools serve: give at least one plugin folder, file or source")
		return 2
	}
	if *stateStore != "" {
		// Before plugins load: a URL's parameters (wait_replicas,
		// master_name) checked without connecting.
		if err := statestore.CheckURL(*stateStore); err != nil {
			log.Error("--state-store refused", "error", err)
			return 2
		}
	}
	if err := common.loadConfig(lookupEnv); err != nil {
		log.Error("configuration refused", "error", err)
		return 1
	}
	cfg := common.config()
	rem, err := newRemote(&srcFlags, &common, log, ui)
	if err != nil {
		log.Error("plugin sources refused", "error", err)
		return 1
	}
	defer rem.close()
	paths := local
	if rem != nil {
		paths = append(paths, rem.mgr.LinkDir())
	}
	if len(paths) == 0 {
		fmt.Fprintln(stderr, "wasmtools serve: give at least one plugin folder, file or source")
		return 2
	}
	rt, err := common.runtime(log)
	if err != nil {
		log.Error("start", "error", err)
		return 1
	}
	defer rt.Close(context.Background())

	settled := make(chan struct{})
	reloader := plugins.NewReloader(rt, plugins.ReloaderOptions{Paths: paths, OptionsFor: common.optsFor(log), Check: rem.check(common.check()), Logger: log,
		OnSettled: func() { close(settled); log.Info("plugins settled: lists answer without waiting for slow plugins") }})
	defer reloader.Close(context.Background())
	// refresh resolves the remote plugins again (a moved tag is fetched
	// and verified beside the version served) and rescans: `wasmtools
	// reload`, SIGHUP and the refresh interval.
	refresh := func(ctx context.Context) (bool, []error) {
		if rem == nil {
			return reloader.Rescan(ctx)
		}
		return rem.sync(ctx, reloader.Rescan)
	}

	if *prepare {
		return prepareOnly(ctx, log, stdout, rt, reloader, rem, local)
	}

	maxRunes := *maxResult
	if maxRunes == 0 {
		maxRunes = -1
	}
	timeout := *sessionTimeout
	if timeout == 0 {
		timeout = -1
	}
	keepAlive := *streamKeepAlive
	if keepAlive == 0 {
		keepAlive = -1
	}
	writeTimeout := *streamWriteTimeout
	if writeTimeout == 0 {
		writeTimeout = -1
	}
	opts := &host.Options{
		Logger: log, Version: version(), MaxResultRunes: maxRunes, SessionTimeout: timeout, StreamKeepAlive: keepAlive, StreamWriteTimeout: writeTimeout,
		MaxInstances: cmp.Or(*maxInstances, cfg.Limits.MaxInstances), MaxInstancesPerPlugin: cmp.Or(*maxPerPlugin, cfg.Limits.MaxInstancesPerPlugin),
		MemoryBudget: uint64(cfg.Limits.MemoryBudget), MaxConcurrentCalls: cfg.Limits.MaxConcurrentCalls,
		InstanceLimits: instanceLimits(cfg), ClientKeyHeader: *clientHeader, DeriveSessionHeader: *deriveHeader, AbandonAfter: *abandonAfter,
		AllowedOrigins: cfg.HTTP.AllowedOrigins,
		MaxParked:      *maxParked, MaxParkedPerClient: *maxParkedPerClient,
		MaxHandles:         *maxHandles,
		MaxGrantQuestions:  cfg.Grants.MaxQuestions,
		MaxCallsPerSubject: cfg.Limits.MaxCallsPerSubject, CallsPerSecondPerSubject: cfg.Limits.CallsPerSecondPerSubject,
		MaxHandlesPerSubject: cfg.Limits.MaxHandlesPerSubject, MaxParkedPerSubject: cfg.Limits.MaxParkedPerSubject,
		MaxParkedBytes: int(cfg.Limits.ParkedBytesTotal), MaxParkedBytesPerSubject: int(cfg.Limits.ParkedBytesPerSubject),
		MaxSessions: *maxSessions, MaxSessionsPerSubject: cfg.Limits.MaxSessionsPerSubject,
		MaxAnonymousTasks:   cfg.Limits.MaxAnonymousTasks,
		StoreBytesPerRecord: int(cfg.Limits.StoreBytesPerRecord), StoreBytesPerTenant: int(cfg.Limits.StoreBytesPerSubject), StoreBytesTotal: int(cfg.Limits.StoreBytesTotal),
	}
	if path := cfg.Grants.RememberFile; path != "" { // read at start: a change needs a restart
		gf, err := grantstore.Open(path)
		if err != nil {
			log.Error("start", "error", err)
			return 1
		}
		opts.GrantFile = gf
	}
	// Subjects (per-subject tokens, OAuth) make the clients tenants,
	// each with its share of the bounds; without, everyone is one.
	opts.Tenants = len(cfg.HTTP.Tokens) > 0 || cfg.HTTP.OAuth != nil
	opts.PluginAccess = accessRules(cfg)
	opts.QuietHandles, opts.QuietPlugins = handleNotes(cfg, *handleNote)
	if key, _ := lookupEnv("WASMTOOLS_STATE_KEY"); key != "" {
		opts.StateKey = []byte(key)
	}
	if *maxConns < 0 {
		log.Error("--max-connections: must not be negative (0: the default)", "max_connections", *maxConns)
		return 2
	}
	if *replica != "" && !host.ValidReplica(*replica) {
		log.Error("--replica: a name is 1 to 32 letters, digits, '-' or '_'", "replica", *replica)
		return 2
	}
	if *checkpoint != host.CheckpointAfterCall && *checkpoint != host.CheckpointOnDrain {
		log.Error("--checkpoint: want after-call or drain", "checkpoint", *checkpoint)
		return 2
	}
	opts.Replica, opts.Checkpoint = *replica, *checkpoint
	if *replica != "" && !flagSet(fs, "drain-delay") {
		// Out of the proxy's rotation before a request meets a 503: its
		// retry and its health check pick the fallback alike.
		*drainDelay = time.Second
	}
	if *stateStore != "" {
		statestore.LogRedis(log)
		store, key, err := openStateStore(*stateStore, opts.StateKey)
		if err != nil {
			log.Error("state store", "error", err)
			return 1
		}
		defer store.Close()
		opts.Store, opts.StateKey = store, key
		tracks, why := sandbox.WriteTracking() // docs/DEPLOY.md, "Write tracking"
		log.Info("sessions are kept in the state store", "store", redactURL(*stateStore), "replica", *replica, "checkpoint", *checkpoint,
			"write_tracking", tracks, "write_tracking_why", why)
		if *httpAddr == "" {
			log.Warn("a stdio session is the process: the state store keeps only HTTP sessions")
		}
	}
	if *recordLog != "" {
		max, err := config.ParseSize(*recordLogMax)
		if err != nil {
			log.Error("record log", "error", fmt.Errorf("--record-log-max: %w", err))
			return 2
		}
		f, err := openRecordLog(*recordLog, int64(max))
		if err != nil {
			log.Error("record log", "error", err)
			return 1
		}
		defer f.Close()
		opts.RecordLog = f
	}
	// Serve at once, and load the plugins meanwhile, in parallel: each is
	// served as soon as it is checked, so a slow or hostile file never
	// holds the others or the client's initialize. Requests that read the
	// catalogue wait up to --load-wait for the first load.
	loaded := make(chan struct{})
	opts.Loaded, opts.LoadWait, opts.Settled = loaded, *loadWait, settled
	h := host.New(reloader, opts)
	// The runtime and the reloader outlive the loads and rescans under
	// way (a compilation cannot be stopped midway, only bounded).
	var background sync.WaitGroup
	defer background.Wait()
	// Serving can end without ctx ending (POST /drain): the background
	// work (watches, refreshes, SIGHUP) stops then too, before the wait.
	ctx, stopBackground := context.WithCancel(ctx)
	defer stopBackground()
	// Remote sources never hold the local plugins: what the store holds
	// verified is linked first (no network), the first load serves it
	// with the local plugins, and the sources are fetched afterwards, in
	// the background, each swapped in once verified and compiled.
	background.Go(func() {
		if rem != nil {
			log.Info("plugin sources: serving what the store holds, fetching in the background")
			for _, err := range rem.restore(ctx) {
				log.Error("plugin source refused", "error", err)
			}
		}
		_, errs := reloader.Load(ctx)
		for _, err := range errs {
			if ctx.Err() != nil && errors.Is(err, context.Canceled) {
				continue // the server stopping, said once by the reloader
			}
			if te := (*plugins.TransientError)(nil); errors.As(err, &te) {
				continue // retrying: said once by the reloader, and in /status
			}
			log.Error("plugin not served", "error", err)
		}
		warnEmptyFolders(log, local)
		common.warnUnknownNames(log, servedName(reloader, srcFlags.remoteArgs))
		log.Info("plugins loaded", "tools", len(reloader.Catalogue().Tools()))
		close(loaded)
		if rem != nil {
			rem.sync(ctx, reloader.Rescan)
			log.Info("plugin sources fetched", "tools", len(reloader.Catalogue().Tools()))
		}
	})
	filesAgain := make(chan struct{}, 1) // the configuration changed: file sources too
	if !*noWatch {
		background.Go(func() {
			if err := reloader.Watch(ctx); err != nil {
				log.Error("hot reload is off", "error", err)
			}
		})
		if common.configPath != "" || common.hyperPath != "" {
			background.Go(func() {
				watchConfig(ctx, log, &common, lookupEnv, reloader, rem, func(cfg *config.File) {
					// Before the plugins are loaded again: one the change
					// enables is served under its rule from the start.
					h.SetInstanceLimits(instanceLimits(cfg))
					h.SetPluginAccess(accessRules(cfg))
					h.SetHandleNotes(handleNotes(cfg, *handleNote))
					h.SetMaxGrantQuestions(cfg.Grants.MaxQuestions)
					select {
					case filesAgain <- struct{}{}:
					default:
					}
				})
			})
		}
		if rem != nil {
			background.Go(func() {
				<-loaded // the first sync runs after the first load
				rem.watchFiles(ctx, filesAgain, reloader.Rescan)
			})
		}
	}
	every := srcFlags.refresh
	if every == 0 {
		every = time.Duration(cfg.Sources.RefreshInterval)
	}
	if rem != nil && every > 0 {
		background.Go(func() { rem.refreshEvery(ctx, every, reloader) })
	}
	if rem != nil {
		// Without a refresh interval a Sync may not come for days; the
		// registration must be renewed all the same (sources.Manager).
		background.Go(func() { rem.mgr.KeepRegistered(ctx) })
	}
	// SIGHUP reloads a server run detached (a service manager, nohup,
	// kill -HUP); run from a terminal, it means the terminal closed, and
	// the server stops as on SIGTERM.
	background.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if interactive {
					log.Info("SIGHUP: the terminal closed: stopping (detached, SIGHUP reloads; `wasmtools reload` always does)")
					stopServing()
					return
				}
				log.Info("SIGHUP: reloading")
				refresh(ctx)
			}
		}
	})
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), *shutdownGrace)
		defer cancel()
		if err := h.Close(sctx); err != nil {
			log.Warn("shutdown", "error", err)
		}
	}()

	if *httpAddr == "" {
		log.Info("serving MCP on stdio")
		err := h.ServeStdio(ctx, stdin, stdout)
		select {
		case <-loaded:
		default:
			// The compilations under way end with the process, and
			// only finished ones are cached: each run would start
			// cold again.
			log.Warn("the client left before the plugins' first load finished: their machine code is not all cached; `wasmtools serve --prepare` with the same arguments fills the cache once")
		}
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) {
			log.Error("stdio transport", "error", err)
			return 1
		}
		return 0
	}
	token := cfg.HTTP.AuthToken
	if v, ok := lookupEnv("WASMTOOLS_AUTH_TOKEN"); ok && v != "" {
		token = v
	}
	for subject, t := range cfg.HTTP.Tokens {
		if token != "" && t == token {
			log.Error("configuration refused", "error", fmt.Errorf("http.tokens.%s: the token is the shared token (auth_token or WASMTOOLS_AUTH_TOKEN), which identifies no one", subject))
			return 1
		}
	}
	op := wauth.Operator{Token: cfg.HTTP.OperatorToken, Subjects: cfg.HTTP.OperatorSubjects, Scope: cfg.HTTP.OperatorScope}
	if v, ok := lookupEnv("WASMTOOLS_OPERATOR_TOKEN"); ok && v != "" {
		op.Token = v
	}
	if op.Token != "" && (op.Token == token || slices.Contains(slices.Collect(maps.Values(cfg.HTTP.Tokens)), op.Token)) {
		log.Error("configuration refused", "error", errors.New("the operator's token (http.operator_token or WASMTOOLS_OPERATOR_TOKEN) is also a tenant's"))
		return 1
	}
	maxConnections := cmp.Or(*maxConns, cfg.HTTP.MaxConnections, host.MaxConnections(*maxSessions))
	return serveHTTP(ctx, log, *httpAddr, h, reloader, rem, refresh, cfg.HTTP, cfg.Limits, token, op, maxConnections, *shutdownGrace, *drainDelay)
}

// serveHTTP serves /mcp, /status, /metrics and /healthz at addr, each
// behind the same checks (host.Guard), until ctx ends.
//
// The server bounds the time to send headers, a body, and the wait for
// the next request on a keep-alive connection. It sets neither
// ReadTimeout, which net/http keeps as a read deadline while the handler
// runs and which would cut off long-lived SSE streams when it passes, nor
// WriteTimeout, which would end every SSE stream.
//
// It stops on ctx's end (SIGTERM, SIGINT) or a POST /drain by draining
// the host (see [host.Host.Drain]): readiness fails at once, open SSE
// streams close, calls in flight finish within grace, and every session
// is left in the state store for the other replicas.
func serveHTTP(ctx context.Context, log *slog.Logger, addr string, h *host.Host, reloader *plugins.Reloader, rem *remote, refresh func(context.Context) (bool, []error), cfg config.HTTP, limits config.Limits, token string, op wauth.Operator, maxConns int, grace, drainDelay time.Duration) int {
	if strings.HasPrefix(addr, ":") {
		addr = "127.0.0.1" + addr // loopback unless told otherwise
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error("listen", "addr", addr, "error", err)
		return 1
	}
	var tenants wauth.Verifier
	if static := wauth.NewStatic(token, cfg.Tokens); !static.Empty() {
		tenants = static
	}
	mux := http.NewServeMux()
	var bearer host.BearerOptions
	var open []string
	if cfg.OAuth != nil {
		rs, err := newResourceServer(*cfg.OAuth)
		if err != nil {
			log.Error("configuration refused", "error", err)
			return 1
		}
		if tenants != nil {
			tenants = wauth.Chain{tenants, rs.verifier}
		} else {
			tenants = rs.verifier
		}
		bearer = host.BearerOptions{ResourceMetadataURL: rs.metadataURL, Scopes: cfg.OAuth.Scopes}
		for _, p := range rs.metadataPaths {
			mux.Handle(p, rs.metadata)
		}
		open = rs.metadataPaths
		log.Info("OAuth resource server", "resource", cfg.OAuth.Resource, "issuer", cfg.OAuth.Issuer, "metadata", rs.metadataURL)
	}
	gate := operatorGate{op: op, tenants: tenants, resourceMetadata: bearer.ResourceMetadataURL}
	mux.Handle("/mcp", h.HTTPHandler())
	if cfg.MetricsPublic {
		mux.Handle("/metrics", h.MetricsHandler())
	} else {
		mux.Handle("/metrics", gate.wrap(h.MetricsHandler(), true))
	}
	mux.Handle("/status", gate.wrap(statusHandler(h, reloader, rem), true))
	mux.Handle("/reload", gate.wrap(reloadHandler(refresh), false))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok")
	})
	mux.Handle("/readyz", h.ReadyHandler())
	drainNow := make(chan struct{})
	var drainOnce sync.Once
	mux.Handle("/drain", gate.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			http.Error(w, "POST to drain", http.StatusMethodNotAllowed)
			return
		}
		drainOnce.Do(func() { close(drainNow) })
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "draining\n")
	}), false))
	guard := host.GuardOptions{
		Verifier:       tenants,
		Bearer:         bearer,
		Open:           open,
		AllowedOrigins: cfg.AllowedOrigins,
		MaxBody:        int64(cfg.MaxRequestBody),
		BodyTimeout:    time.Duration(cfg.BodyTimeout),
		// The same tenants as the host's (opts.Tenants): subjects' own
		// tokens or OAuth, not the shared token alone.
		Tenants:      len(cfg.Tokens) > 0 || cfg.OAuth != nil,
		RequestBytes: int64(limits.RequestBytesTotal), RequestBytesPerSubject: int64(limits.RequestBytesPerSubject),
		Metrics: h,
	}
	// Probes (a proxy's health check, Kubernetes') send no token; they
	// learn only whether the replica is up and ready, and its name.
	// The operator's endpoints check the operator's credential themselves
	// (a tenant's token is not one).
	guard.Public = append([]string{"/healthz", "/readyz"}, operatorPaths...)
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); tenants == nil && !net.ParseIP(host).IsLoopback() {
		log.Warn("serving beyond loopback without authentication: set http.auth_token in the configuration, or WASMTOOLS_AUTH_TOKEN")
	}
	srv := &http.Server{
		Handler:           host.Guard(mux, guard),
		ReadHeaderTimeout: durationOr(time.Duration(cfg.HeaderTimeout), host.DefaultHeaderTimeout),
		IdleTimeout:       durationOr(time.Duration(cfg.IdleTimeout), host.DefaultIdleTimeout),
		MaxHeaderBytes:    int(cmp.Or(cfg.MaxHeaderBytes, host.DefaultMaxHeaderBytes)),
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ConnState: func(c net.Conn, s http.ConnState) {
			if hook := connStateHook.Load(); hook != nil {
				(*hook)(c, s)
			}
		},
	}
	log.Info("serving MCP over streamable HTTP", "url", "http://"+ln.Addr().String()+"/mcp", "max_connections", maxConns)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(host.LimitConnections(ln, maxConns, log, h)) }()
	select {
	case err := <-errc:
		log.Error("http server", "error", err)
		return 1
	case <-ctx.Done():
	case <-drainNow:
	}
	// The grace bounds the calls in flight; the drain delay comes first.
	sctx, cancel := context.WithTimeout(context.Background(), drainDelay+grace)
	defer cancel()
	if err := h.Drain(sctx, host.DrainOptions{Delay: drainDelay}); err != nil {
		log.Warn("drain", "error", err)
	}
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("http shutdown", "error", err)
	}
	return 0
}

func durationOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// pluginStatus is one plugin in /status and `wasmtools status`.
type pluginStatus struct {
	plugins.Status
	LiveInstances int `json:"liveInstances"`
	// Source is a remote plugin's: its source, the digest a tag resolved
	// to, what verified it, and why its last fetch failed.
	Source *sources.Status `json:"source,omitempty"`
}

// statusReport is what /status serves.
type statusReport struct {
	Plugins []pluginStatus `json:"plugins"`
	// Grants are the run-time grant counts of each session that was
	// asked for or gave one (see [host.Host.GrantStatus]).
	Grants []host.SessionGrants `json:"grants"`
}

func statusHandler(h *host.Host, r *plugins.Reloader, rem *remote) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		live := h.LiveInstancesByPlugin()
		rep := statusReport{Plugins: []pluginStatus{}, Grants: h.GrantStatus()}
		linked := map[string]bool{}
		for _, st := range r.Status() {
			ps := pluginStatus{Status: st, LiveInstances: live[st.Name]}
			if rem != nil && filepath.Dir(st.Path) == rem.mgr.LinkDir() {
				if src, ok := rem.mgr.Lookup(st.Name); ok {
					linked[st.Name] = true
					ps.Source = &src
					ps.Path = src.Source
					switch {
					case src.Error != "" && ps.Error == "":
						ps.State, ps.Error = plugins.StateError, src.Error
					case ps.Error == "" && src.SHA256 != ps.SHA256:
						ps.State = plugins.StateLoading // verified, not swapped in yet
					}
				}
			}
			rep.Plugins = append(rep.Plugins, ps)
		}
		if rem != nil {
			for _, src := range rem.mgr.Status() {
				if linked[src.Name] {
					continue
				}
				state := plugins.StateLoading
				if src.Error != "" {
					state = plugins.StateError
				}
				rep.Plugins = append(rep.Plugins, pluginStatus{
					Status: plugins.Status{Name: src.Name, Path: src.Source, State: state, Error: src.Error, Tools: []string{}, LastReload: src.Checked},
					Source: &src,
				})
			}
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	})
}

// handleNotes are the configuration's handle note settings under the
// --handle-note flag, as host.Options' QuietHandles and QuietPlugins: the
// flag's false silences every plugin; [defaults] handle_note = false
// those without an entry.
func handleNotes(cfg *config.File, flag bool) (quiet bool, plugins map[string]bool) {
	plugins = map[string]bool{}
	if !flag {
		return true, plugins
	}
	for name := range cfg.Plugins {
		plugins[name] = !cfg.For(name).HandleNote
	}
	return !cfg.For("").HandleNote, plugins
}

// accessRules are the configuration's access rules ([plugins.NAME]
// access), by plugin name; nil for none.
func accessRules(cfg *config.File) map[string]host.AccessRule {
	var rules map[string]host.AccessRule
	for name, p := range cfg.Plugins {
		if a := p.Access; a != nil {
			if rules == nil {
				rules = map[string]host.AccessRule{}
			}
			rules[name] = host.AccessRule{Subjects: a.Subjects, Scopes: a.Scopes, Claims: a.Claims}
		}
	}
	return rules
}

// instanceLimits are the configuration's bounds of each plugin's live
// instances (max_instances), by plugin name, "" for the plugins without
// an entry ([defaults]).
func instanceLimits(cfg *config.File) map[string]int {
	limits := map[string]int{}
	if n := cfg.For("").Instances; n > 0 {
		limits[""] = n
	}
	for name := range cfg.Plugins {
		if n := cfg.For(name).Instances; n > 0 {
			limits[name] = n
		}
	}
	return limits
}

// watchConfig reloads the configuration file when it changes: a valid new
// configuration is applied to every plugin (each is loaded again under
// it, after applied has seen it); an invalid one is logged and the old
// one kept. Global limits and HTTP settings take effect on restart.
func watchConfig(ctx context.Context, log *slog.Logger, common *commonFlags, lookupEnv func(string) (string, bool), r *plugins.Reloader, rem *remote, applied func(*config.File)) {
	if hook := configWatchHook.Load(); hook != nil {
		(*hook)()
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Error("configuration watch is off", "error", err)
		return
	}
	defer w.Close()
	var files []string
	dirs := map[string]bool{} // the files' own folders
	for _, p := range []string{common.configPath, common.hyperPath} {
		if p == "" {
			continue
		}
		files = append(files, filepath.Clean(p))
		dirs[filepath.Dir(filepath.Clean(p))] = true
		if err := w.Add(filepath.Dir(p)); err != nil {
			log.Error("configuration watch is off", "error", err)
			return
		}
	}
	// A file that is a link changes without an event naming it: its
	// target is rewritten elsewhere, or (Kubernetes' atomic writer, for
	// a ConfigMap or Secret volume) the "..data" link it points through
	// is replaced. The targets' folders are watched too, followed again
	// after each change, and a change of "..data" beside a file counts.
	targets := map[string]bool{}    // the files' targets, when links
	targetDirs := map[string]bool{} // their folders watched for them
	follow := func() {
		clear(targets)
		want := map[string]bool{}
		for _, f := range files {
			t, err := filepath.EvalSymlinks(f)
			if err != nil || t == f {
				continue
			}
			targets[t] = true
			want[filepath.Dir(t)] = true
		}
		for d := range targetDirs {
			if !want[d] && !dirs[d] {
				_ = w.Remove(d)
			}
		}
		clear(targetDirs)
		for d := range want {
			if dirs[d] {
				continue
			}
			if err := w.Add(d); err != nil {
				log.Warn("configuration watch: the folder of a linked file's target", "folder", d, "error", err)
				continue
			}
			targetDirs[d] = true
		}
	}
	follow()
	relevant := func(name string) bool {
		name = filepath.Clean(name)
		return slices.Contains(files, name) || targets[name] ||
			filepath.Base(name) == plugins.K8sDataLink && dirs[filepath.Dir(name)]
	}
	// The remote sources are synced apart, after the plugins are
	// reloaded under the new configuration: a registry or server that
	// stalls (up to [sources] timeout) holds neither this change nor the
	// next. Changes that come during a sync are synced once after it.
	kick := make(chan struct{}, 1)
	var syncer sync.WaitGroup
	defer syncer.Wait()
	if rem != nil {
		syncer.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-kick:
					rem.sync(ctx, r.Rescan) // sources added or changed: fetched, then served
				}
			}
		})
	}
	var timer *time.Timer
	fire := make(chan struct{}, 1)
	if common.configChanged() {
		// Edited after it was read at start, before the watch began: no
		// event will say so.
		timer = time.AfterFunc(0, func() { fire <- struct{}{} })
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-w.Events:
			if !relevant(ev.Name) {
				continue
			}
			if timer == nil {
				timer = time.AfterFunc(100*time.Millisecond, func() { fire <- struct{}{} })
			} else {
				timer.Reset(100 * time.Millisecond)
			}
		case <-fire:
			follow()
			if empty := emptyFile(files); empty != "" {
				// Truncated to be written again in place (a command's
				// output redirected into it): read once it is written.
				log.Error("new configuration refused: the old one stays in force", "error", fmt.Errorf("%s is empty (being written?); an empty configuration needs at least a comment", empty))
				continue
			}
			if err := common.loadConfig(lookupEnv); err != nil {
				log.Error("new configuration refused: the old one stays in force", "error", err)
				continue
			}
			log.Info("configuration reloaded", "path", strings.Join(files, ", "))
			applied(common.config())
			rem.prune() // sources removed, or whose verification settings changed
			r.Reconfigure(ctx, common.optsFor(log), rem.check(common.check()))
			common.warnUnknownNames(log, servedName(r, nil))
			select {
			case kick <- struct{}{}:
			default: // a sync is due already: it reads the configuration then
			}
		}
	}
}

// servedName reports whether r knows a plugin by that name (served,
// loading or refused), or the command line names a source by it.
func servedName(r *plugins.Reloader, remoteArgs []string) func(string) bool {
	known := map[string]bool{}
	for _, s := range r.Status() {
		known[s.Name] = true
	}
	for _, a := range remoteArgs {
		name, _ := argName(a)
		known[name] = true
	}
	return func(name string) bool { return known[name] }
}

// warnEmptyFolders says which folders served hold no plugin file: serve
// takes the *.wasm directly inside a folder, and a user who names the
// folder above them (examples/plugins for examples/plugins/dist) was told
// only "tools=0". The subfolders that do hold some are named.
func warnEmptyFolders(log *slog.Logger, paths []string) {
	for _, p := range paths {
		entries, err := os.ReadDir(p)
		if err != nil {
			continue // a file, or an error said already
		}
		var below []string
		found := false
		for _, e := range entries {
			if plugins.IsPluginFile(e.Name()) {
				found = true
				break
			}
			if e.IsDir() && len(below) < 5 {
				if sub, err := os.ReadDir(filepath.Join(p, e.Name())); err == nil && slices.ContainsFunc(sub, func(d os.DirEntry) bool { return plugins.IsPluginFile(d.Name()) }) {
					below = append(below, filepath.Join(p, e.Name()))
				}
			}
		}
		if found {
			continue
		}
		if len(below) > 0 {
			log.Warn("no plugins in this folder: serve takes the *.wasm directly inside a folder, not in its subfolders; these hold some", "path", p, "subfolders", strings.Join(below, ", "))
		} else {
			log.Warn("no plugins in this folder (serve takes the *.wasm directly inside it)", "path", p)
		}
	}
}

// emptyFile returns the first of files that is empty, or "".
func emptyFile(files []string) string {
	for _, f := range files {
		if info, err := os.Stat(f); err == nil && info.Size() == 0 {
			return f
		}
	}
	return ""
}

// openStateStore opens the --state-store URL, sealed with the state key.
// A file store on one machine needs no shared key: without
// WASMTOOLS_STATE_KEY, one is made once and kept beside the file (0600),
// so that sessions and handles survive a restart. Replicas sharing a Redis
// store must share WASMTOOLS_STATE_KEY.
func openStateStore(url string, key []byte) (statestore.Store, []byte, error) {
	if len(key) == 0 {
		if !strings.HasPrefix(url, "file") {
			return nil, nil, fmt.Errorf("--state-store %s: set WASMTOOLS_STATE_KEY, the same on every replica (it seals the stored states and signs session handles)", redactURL(url))
		}
		path := strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(url, "file"), ":"), "//")
		if path == "" {
			p, err := statestore.DefaultPath()
			if err != nil {
				return nil, nil, err
			}
			path = p
		}
		k, err := fileKey(path + ".key")
		if err != nil {
			return nil, nil, fmt.Errorf("--state-store: %w", err)
		}
		key = k
	}
	s, err := statestore.Open(url, key)
	return s, key, err
}

// fileKey reads the key at path, making it first if there is none (see
// statestore.KeyFile: written atomically and synced).
func fileKey(path string) ([]byte, error) { return statestore.KeyFile(path) }

// redactURL hides a store URL's passwords in logs: its userinfo's, and a
// Sentinel URL's password= parameter (the primary's); a query that does
// not parse whole (whose pairs url.Query would drop, a password among
// them) is hidden whole.
func redactURL(s string) string {
	u, err := neturl.Parse(s)
	if err != nil {
		return s
	}
	q, err := neturl.ParseQuery(u.RawQuery)
	if err != nil {
		u.RawQuery = "xxxxx"
		return u.Redacted()
	}
	if u.User == nil && !q.Has("password") {
		return s
	}
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// reloadHandler serves POST /reload: refresh, answered with whether the
// catalogue changed and the errors.
func reloadHandler(refresh func(context.Context) (bool, []error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		changed, errs := refresh(req.Context())
		rep := reloadReport{Changed: changed, Errors: []string{}}
		for _, err := range errs {
			rep.Errors = append(rep.Errors, err.Error())
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(rep)
	})
}
