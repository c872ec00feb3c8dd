package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/config"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// inspection is what `wasmtools inspect --json` prints.
type inspection struct {
	Path      string         `json:"path"`
	Size      int            `json:"size"`
	SHA256    string         `json:"sha256"`
	Interface abi.Interface  `json:"interface,omitempty"`
	Tools     []abi.Tool     `json:"tools"`
	Imports   []sandbox.Func `json:"imports"`
	Exports   []sandbox.Func `json:"exports"`
	// Error is why the host would not serve the plugin, if it would not.
	Error string `json:"error,omitempty"`
	// Requested is what the plugin says it needs (its manifest: the
	// wasmtools.manifest custom section, or FILE.manifest.json beside
	// it); Granted is what the configuration grants it.
	Requested *plugins.Manifest `json:"requested,omitempty"`
	Granted   plugins.Manifest  `json:"granted"`
	// Missing lists what is requested and not granted.
	Missing []string `json:"missing,omitempty"`
	// Ask is the ceiling of run-time grants: what the person using a
	// client may approve ([plugins.NAME.ask]).
	Ask *askCeiling `json:"ask,omitempty"`
	// Snapshot says whether the host can save and restore the plugin's
	// instances itself (durable sessions, state kept across a
	// configuration change), and if not, why not.
	Snapshot *snapshotAbility `json:"snapshot,omitempty"`
}

// askCeiling is what a plugin may be given at run time: hosts, folders
// ("GUEST (MODE, from HOST)") and secret names.
type askCeiling struct {
	Hosts   []string `json:"hosts,omitempty"`
	Paths   []string `json:"paths,omitempty"`
	Secrets []string `json:"secrets,omitempty"`
}

// ceilingOf returns e's ceiling, nil for none.
func ceilingOf(e config.Effective) *askCeiling {
	c := &askCeiling{Hosts: e.Network.Ask, Paths: mountNames(e.AskMounts), Secrets: slices.Sorted(maps.Keys(e.Options.AskSecrets))}
	if len(c.Hosts)+len(c.Paths)+len(c.Secrets) == 0 {
		return nil
	}
	return c
}

// mountNames describes mounts as "GUEST (MODE, from HOST)".
func mountNames(mounts []sandbox.Mount) []string {
	var out []string
	for _, m := range mounts {
		mode := "ro"
		if !m.ReadOnly {
			mode = "rw"
		}
		out = append(out, m.GuestPath+" ("+mode+", from "+m.HostPath+")")
	}
	return out
}

// snapshotAbility is the snapshot part of an inspection.
type snapshotAbility struct {
	Host bool `json:"host"`
	// Reason is why the host cannot, when it cannot.
	Reason string `json:"reason,omitempty"`
	// Guest says whether the plugin exports its own handoff pair, the
	// fallback.
	Guest bool `json:"guest"`
	// Images says whether new instances start from a pre-initialised
	// image, which shares the guest runtime's seeded state between
	// sessions (docs/SECURITY.md); NoImages why not.
	Images   bool   `json:"images"`
	NoImages string `json:"no_images,omitempty"`
	// PreInitialize says whether the plugin exports Wizer's
	// pre-initialisation (abi.ExportPreInitialize), which the host runs
	// once before keeping the image.
	PreInitialize bool `json:"pre_initialize"`
}

func cmdInspect(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var common commonFlags
	common.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: wasmtools inspect [flags] FILE.wasm\n\nShows which plugin interface the plugin speaks, its tools with their\nschemas, its imports and exports, its size and sha256, and whether\nthe host can snapshot its instances (and why not). Exits 1 if the\nhost would not serve it, and says why.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return flagsExit(err)
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	path := fs.Arg(0)
	log := newLogger(stderr, common.verbose)
	if err := common.loadConfig(lookupEnv); err != nil {
		fmt.Fprintf(stderr, "wasmtools inspect: %v\n", err)
		return 1
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "wasmtools inspect: %v\n", err)
		return 1
	}
	rt, err := common.runtime(log)
	if err != nil {
		fmt.Fprintf(stderr, "wasmtools inspect: %v\n", err)
		return 1
	}
	defer rt.Close(context.Background())

	sum := sha256.Sum256(wasm)
	in := inspection{Path: path, Size: len(wasm), SHA256: hex.EncodeToString(sum[:]), Tools: []abi.Tool{}, Imports: []sandbox.Func{}, Exports: []sandbox.Func{}}
	if info, err := rt.Inspect(ctx, wasm); err != nil {
		in.Error = err.Error()
	} else {
		in.Imports, in.Exports = info.Imports, info.Exports
	}
	if in.Error == "" {
		p, err := plugins.Load(ctx, rt, path, wasm, common.optsFor(log)(path))
		if err != nil {
			in.Error = err.Error()
		} else {
			in.Interface = p.Interface()
			in.Requested, err = p.Manifest()
			if err != nil {
				in.Error = err.Error()
			}
			if b, err := os.ReadFile(strings.TrimSuffix(path, ".wasm") + ".manifest.json"); err == nil && in.Requested == nil {
				in.Requested = &plugins.Manifest{}
				if err := json.Unmarshal(b, in.Requested); err != nil {
					in.Error = "manifest file: " + err.Error()
				}
			}
			in.Granted, in.Missing = granted(common.config().For(pluginName(path)), in.Requested)
			in.Ask = ceilingOf(common.config().For(pluginName(path)))
			in.Snapshot = &snapshotAbility{Host: true, Guest: p.HandsOffState()}
			in.Snapshot.Images, in.Snapshot.NoImages = p.UsesImages()
			in.Snapshot.PreInitialize = p.HasExport(abi.ExportPreInitialize)
			if err := p.CanSnapshot(); err != nil {
				in.Snapshot.Host = false
				var se *sandbox.SnapshotError
				if errors.As(err, &se) {
					in.Snapshot.Reason = se.Reason
				} else {
					in.Snapshot.Reason = err.Error()
				}
			}
			for _, t := range p.Tools() {
				d := t.Def
				d.Name = t.Name
				in.Tools = append(in.Tools, d)
			}
			p.Close(ctx)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(in)
	} else {
		printInspection(stdout, in)
	}
	if in.Error != "" {
		return 1
	}
	return 0
}

func printInspection(w io.Writer, in inspection) {
	fmt.Fprintf(w, "plugin:    %s\nsize:      %d bytes\nsha256:    %s\n", in.Path, in.Size, in.SHA256)
	if in.Interface != "" {
		fmt.Fprintf(w, "interface: %s\n", in.Interface)
	}
	if in.Error != "" {
		fmt.Fprintf(w, "error:     %s\n", in.Error)
	}
	fmt.Fprintf(w, "\ntools (%d):\n", len(in.Tools))
	for _, t := range in.Tools {
		fmt.Fprintf(w, "  %s\n", t.Name)
		if t.Description != "" {
			fmt.Fprintf(w, "    %s\n", t.Description)
		}
		var schema any
		if json.Unmarshal(t.InputSchema, &schema) == nil {
			b, _ := json.Marshal(schema)
			fmt.Fprintf(w, "    input: %s\n", b)
		}
	}
	if in.Requested != nil {
		fmt.Fprintf(w, "\ngrants:\n  hosts   requested %v, granted %v\n  paths   requested %v, granted %v\n  config  requested %v, granted %v\n  env     requested %v, granted %v\n",
			in.Requested.Hosts, in.Granted.Hosts, in.Requested.Paths, in.Granted.Paths, in.Requested.Config, in.Granted.Config, in.Requested.Env, in.Granted.Env)
		if len(in.Missing) > 0 {
			fmt.Fprintf(w, "  not granted: %s\n", strings.Join(in.Missing, ", "))
		}
	} else if g := in.Granted; len(g.Hosts)+len(g.Paths)+len(g.Config)+len(g.Env) > 0 {
		// No manifest says what it needs; what the configuration grants
		// is shown all the same (it was only in --json).
		fmt.Fprintf(w, "\ngrants (the plugin states no needs):\n  hosts   granted %v\n  paths   granted %v\n  config  granted %v\n  env     granted %v\n",
			g.Hosts, g.Paths, g.Config, g.Env)
	}
	if a := in.Ask; a != nil {
		fmt.Fprintf(w, "\nmay ask the person (run-time grants):\n  hosts   %v\n  paths   %v\n  secrets %v\n", a.Hosts, a.Paths, a.Secrets)
	}
	if s := in.Snapshot; s != nil {
		switch {
		case s.Host:
			fmt.Fprintf(w, "\nsnapshot:  yes: the host can save and restore its instances\n")
		case s.Guest:
			fmt.Fprintf(w, "\nsnapshot:  the plugin's own (%s), not the host's: %s\n", abi.ExportSnapshot, s.Reason)
		default:
			fmt.Fprintf(w, "\nsnapshot:  no: %s; and it exports no %s\n", s.Reason, abi.ExportSnapshot)
		}
		if s.Images {
			fmt.Fprintf(w, "images:    yes: sessions start from one pre-initialised image, sharing its seeded non-cryptographic randomness (math/rand, map order); crypto/rand stays per call\n")
		} else {
			fmt.Fprintf(w, "images:    no: %s\n", s.NoImages)
		}
		if s.PreInitialize {
			when := "once, before the image is kept: its state is every session's"
			if !s.Images {
				when = "in every new instance"
			}
			fmt.Fprintf(w, "pre-init:  %s runs %s\n", abi.ExportPreInitialize, when)
		}
	}
	fmt.Fprintf(w, "\nimports (%d):\n", len(in.Imports))
	for _, f := range in.Imports {
		fmt.Fprintf(w, "  %s.%s %s\n", f.Module, f.Name, f.Signature)
	}
	fmt.Fprintf(w, "\nexports (%d):\n", len(in.Exports))
	for _, f := range in.Exports {
		fmt.Fprintf(w, "  %s %s\n", f.Name, f.Signature)
	}
}

// granted lists what a plugin's effective configuration grants, and what
// of the request it does not.
func granted(e config.Effective, req *plugins.Manifest) (plugins.Manifest, []string) {
	g := plugins.Manifest{Hosts: e.Network.AllowedHosts, Paths: mountNames(e.Mounts)}
	g.Config = slices.Sorted(maps.Keys(e.Options.Policy.Config()))
	g.Env = slices.Sorted(maps.Keys(e.Options.Policy.Env()))
	if req == nil {
		return g, nil
	}
	var missing []string
	for _, h := range req.Hosts {
		if !(&sandbox.Network{AllowedHosts: g.Hosts}).Allows(h) {
			missing = append(missing, "host "+h)
		}
	}
	for _, p := range req.Paths {
		found := false
		for _, m := range e.Mounts {
			found = found || m.GuestPath == p
		}
		if !found {
			missing = append(missing, "path "+p)
		}
	}
	for _, k := range req.Config {
		if !slices.Contains(g.Config, k) {
			missing = append(missing, "config "+k)
		}
	}
	for _, k := range req.Env {
		if !slices.Contains(g.Env, k) {
			missing = append(missing, "env "+k)
		}
	}
	return g, missing
}
