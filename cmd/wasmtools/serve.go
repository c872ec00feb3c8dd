package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// prefixes is a repeatable NAME=PREFIX flag.
type prefixes map[string]string

func (p prefixes) String() string { return fmt.Sprint(map[string]string(p)) }
func (p prefixes) Set(v string) error {
	name, prefix, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return errors.New("want PLUGIN=PREFIX")
	}
	p[name] = prefix
	return nil
}

// names is a repeatable PLUGIN flag.
type names map[string]bool

func (n names) String() string { return fmt.Sprint(map[string]bool(n)) }
func (n names) Set(v string) error {
	n[v] = true
	return nil
}

// commonFlags are the flags of every command that loads plugins.
type commonFlags struct {
	cacheDir  string
	verbose   bool
	prefix    prefixes
	stateless names
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	c.prefix = prefixes{}
	c.stateless = names{}
	fs.Var(c.stateless, "stateless", "PLUGIN: the plugin keeps no state between calls; serve it from a shared pool of warm instances (repeatable)")
	fs.StringVar(&c.cacheDir, "cache-dir", defaultCacheDir(), "where compiled plugins are cached between runs (\"\" for no disk cache)")
	fs.BoolVar(&c.verbose, "v", false, "log debug messages")
	fs.Var(c.prefix, "prefix", "PLUGIN=PREFIX: serve PLUGIN's tools as PREFIX+name (repeatable)")
}

func (c *commonFlags) runtime(log *slog.Logger) (*sandbox.Runtime, error) {
	return sandbox.NewRuntime(sandbox.Options{CacheDir: c.cacheDir, Logger: log})
}

func (c *commonFlags) optsFor(log *slog.Logger) func(path string) plugins.Options {
	return func(path string) plugins.Options {
		name := pluginName(path)
		pol := sandbox.NewPolicy().WithLogger(log.With("plugin", name))
		return plugins.Options{Prefix: c.prefix[name], Policy: &pol, Stateless: c.stateless[name]}
	}
}

func pluginName(path string) string {
	base := path[strings.LastIndexAny(path, `/\`)+1:]
	return strings.TrimSuffix(base, ".wasm")
}

func cmdServe(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var common commonFlags
	common.register(fs)
	httpAddr := fs.String("http", "", "serve streamable HTTP at ADDR/mcp (for example 127.0.0.1:8080) instead of stdio")
	sessionTimeout := fs.Duration("session-timeout", host.DefaultSessionTimeout, "close HTTP sessions idle this long (0: never)")
	maxResult := fs.Int("max-result", host.DefaultMaxResultRunes, "cap each tool result at this many characters (0: no cap)")
	maxInstances := fs.Int("max-instances", 0, "at most this many live plugin instances; the least recently used idle one is evicted (0: no bound)")
	maxPerPlugin := fs.Int("max-instances-per-plugin", 0, "at most this many live instances of any one plugin (0: no bound)")
	clientHeader := fs.String("client-header", "", "HTTP header that identifies a client on sessionless (2026-07-28) requests, so its calls share instances; not authentication")
	recordLog := fs.String("record-log", "", "append one JSON line per tool call (with the records it wrote) to FILE")
	abandonAfter := fs.Duration("abandon-after", host.DefaultAbandonAfter, "stop a call waiting for a 2026-07-28 client's answer after this long")
	noWatch := fs.Bool("no-watch", false, "do not watch the plugin folders: serve what is there at start")
	shutdownGrace := fs.Duration("shutdown-grace", 10*time.Second, "on shutdown, wait this long for calls in flight")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: wasmtools serve [flags] PATH...\n\nServes every .wasm plugin in the folders and files given, over MCP on stdio\n(or streamable HTTP with --http). A plugin that fails to load is logged\nand skipped; the rest are served.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := newLogger(stderr, common.verbose)
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "wasmtools serve: give at least one plugin folder or file")
		return 2
	}
	rt, err := common.runtime(log)
	if err != nil {
		log.Error("start", "error", err)
		return 1
	}
	defer rt.Close(context.Background())

	reloader := plugins.NewReloader(rt, plugins.ReloaderOptions{Paths: fs.Args(), OptionsFor: common.optsFor(log), Logger: log})
	cat, errs := reloader.Load(ctx)
	for _, err := range errs {
		log.Error("plugin not served", "error", err)
	}
	defer reloader.Close(context.Background())

	maxRunes := *maxResult
	if maxRunes == 0 {
		maxRunes = -1
	}
	timeout := *sessionTimeout
	if timeout == 0 {
		timeout = -1
	}
	opts := &host.Options{
		Logger: log, MaxResultRunes: maxRunes, SessionTimeout: timeout,
		MaxInstances: *maxInstances, MaxInstancesPerPlugin: *maxPerPlugin, ClientKeyHeader: *clientHeader,
		AbandonAfter: *abandonAfter,
	}
	if key := getenv("WASMTOOLS_STATE_KEY"); key != "" {
		opts.StateKey = []byte(key)
	}
	if *recordLog != "" {
		f, err := os.OpenFile(*recordLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			log.Error("record log", "error", err)
			return 1
		}
		defer f.Close()
		opts.RecordLog = f
	}
	h := host.New(cat, opts)
	reloader.OnSwap(func(_ context.Context, s plugins.Swap) { h.Swap(s) })
	if !*noWatch {
		go func() {
			if err := reloader.Watch(ctx); err != nil {
				log.Error("hot reload is off", "error", err)
			}
		}()
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), *shutdownGrace)
		defer cancel()
		if err := h.Close(sctx); err != nil {
			log.Warn("shutdown", "error", err)
		}
	}()

	if *httpAddr == "" {
		log.Info("serving MCP on stdio", "tools", len(cat.Tools()))
		err := h.Server().Run(ctx, &mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}})
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) {
			log.Error("stdio transport", "error", err)
			return 1
		}
		return 0
	}
	return serveHTTP(ctx, log, *httpAddr, h, reloader, *shutdownGrace)
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func serveHTTP(ctx context.Context, log *slog.Logger, addr string, h *host.Host, reloader *plugins.Reloader, grace time.Duration) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error("listen", "addr", addr, "error", err)
		return 1
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", h.HTTPHandler())
	mux.Handle("/metrics", h.MetricsHandler())
	mux.Handle("/status", statusHandler(h, reloader))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving MCP over streamable HTTP", "url", "http://"+ln.Addr().String()+"/mcp")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		log.Error("http server", "error", err)
		return 1
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("http shutdown", "error", err)
	}
	return 0
}

// pluginStatus is one plugin in /status and `wasmtools status`.
type pluginStatus struct {
	plugins.Status
	LiveInstances int `json:"liveInstances"`
}

// statusReport is what /status serves.
type statusReport struct {
	Plugins []pluginStatus `json:"plugins"`
}

func statusHandler(h *host.Host, r *plugins.Reloader) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		live := h.LiveInstancesByPlugin()
		rep := statusReport{Plugins: []pluginStatus{}}
		for _, st := range r.Status() {
			rep.Plugins = append(rep.Plugins, pluginStatus{Status: st, LiveInstances: live[st.Name]})
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	})
}
