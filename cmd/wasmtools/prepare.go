package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// prepareOnly is `wasmtools serve --prepare`: everything serving does
// before its first list, and nothing after. The remote sources are
// fetched and verified into the source store, then every plugin is
// loaded as serving loads it (the same configuration, checks and
// rewriting), which leaves its machine code in the compilation cache.
//
// It exists because a cold start compiles every plugin, which on a busy
// machine can outlast a client's first list (--load-wait), and a process
// that exits before its compilations finish never fills the cache: a
// one-shot stdio client would meet a cold start at every run, and every
// new container of an image would compile everything again. Run once
// (in the image's build, or after installing plugins), it makes the next
// start a warm one. The cache is keyed by the module's bytes, wazero's
// version and the CPU's features, so a cache built on another machine is
// a miss there, never a wrong answer.
func prepareOnly(ctx context.Context, log *slog.Logger, stdout io.Writer, rt *sandbox.Runtime, reloader *plugins.Reloader, rem *remote, local []string) int {
	failed := false
	// Printed below the table as well: a source not fetched has no row in
	// it, and the user reads what --prepare prints, not only its log.
	var refused []error
	if rem != nil {
		// Fetched and linked first, so that the load below compiles
		// each source's current version, not the one the store held.
		_, errs := rem.sync(ctx, nil)
		for _, err := range errs {
			log.Error("plugin source refused", "error", err)
			failed = true
		}
		refused = errs
	}
	_, errs := reloader.Load(ctx)
	for _, err := range errs {
		log.Error("plugin not served", "error", err)
		failed = true
	}
	warnEmptyFolders(log, local)
	if ctx.Err() != nil {
		log.Error("prepare stopped", "error", context.Cause(ctx))
		return 1
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tTOOLS")
	var failures []plugins.Status
	for _, s := range reloader.Status() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, s.State, strings.Join(s.Tools, ","))
		if s.State == plugins.StateError {
			failures = append(failures, s)
		}
	}
	tw.Flush()
	for _, s := range failures {
		fmt.Fprintf(stdout, "\n%s (%s): %s\n", s.Name, s.Path, s.Error)
	}
	for _, err := range refused {
		fmt.Fprintf(stdout, "\nnot fetched: %v\n", err)
	}
	if err := rt.DiskCacheError(); err != nil {
		// Served all the same, but what --prepare is for did not happen.
		fmt.Fprintf(stdout, "\nthe compilation cache could not be filled: %v\n", err)
		failed = true
	}
	if failed || len(failures) > 0 {
		return 1
	}
	return 0
}
