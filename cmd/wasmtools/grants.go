package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/wasmtools/wasmtools/internal/config"
	"github.com/wasmtools/wasmtools/internal/grantstore"
)

// cmdGrants lists or revokes the run-time grant answers a server keeps per
// subject ([grants] remember_file).
func cmdGrants(_ context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("grants", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("file", "", "the answers file (else the configuration's [grants] remember_file)")
	cfgPath := fs.String("config", "", "the configuration file that names the answers file")
	asJSON := fs.Bool("json", false, "list: print JSON")
	subject := fs.String("subject", "", "revoke: only this subject's answers (\"local\": stdio sessions)")
	plugin := fs.String("plugin", "", "revoke: only this plugin's answers")
	target := fs.String("target", "", "revoke: only answers for this target (host:port, \"FOLDER MODE\", secret name)")
	all := fs.Bool("all", false, "revoke: every answer (else at least one of --subject, --plugin, --target)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: wasmtools grants [flags] list|revoke

Lists, or revokes, the answers to run-time grant questions that a server
keeps per subject ("always allow" and "deny", with [grants] remember_file).
A revocation holds at a running server's next lookup: that subject is asked
again (a session keeps what it was told for the session).

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return flagsExit(err)
	}
	if fs.NArg() != 1 || (fs.Arg(0) != "list" && fs.Arg(0) != "revoke") {
		fs.Usage()
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "wasmtools grants: %v\n", err)
		return 1
	}
	path := *file
	if path == "" && *cfgPath != "" {
		cfg, err := config.Load(*cfgPath, lookupEnv)
		if err != nil {
			return fail(err)
		}
		path = cfg.Grants.RememberFile
	}
	if path == "" {
		return fail(errors.New("no answers file: give --file, or --config naming one in [grants] remember_file"))
	}
	gf, err := grantstore.Open(path)
	if err != nil {
		return fail(err)
	}
	if fs.Arg(0) == "revoke" {
		if !*all && *subject == "" && *plugin == "" && *target == "" {
			return fail(errors.New("revoke what? give --subject, --plugin or --target, or --all"))
		}
		n, err := gf.Revoke(func(e grantstore.Entry) bool {
			return (*subject == "" || e.Subject == *subject) && (*plugin == "" || e.Plugin == *plugin) && (*target == "" || e.Target == *target)
		})
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "revoked %d answers\n", n)
		return 0
	}
	list, err := gf.List()
	if err != nil {
		return fail(err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(list); err != nil {
			return fail(err)
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBJECT\tPLUGIN\tSHA256\tKIND\tTARGET\tANSWER\tWHEN")
	for _, e := range list {
		answer := "deny"
		if e.Allowed {
			answer = "always allow"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.12s\t%s\t%s\t%s\t%s\n", e.Subject, e.Plugin, e.SHA256, e.Kind, e.Target, answer, e.Time.Format("2006-01-02 15:04"))
	}
	tw.Flush()
	return 0
}
