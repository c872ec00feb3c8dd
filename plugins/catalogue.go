package plugins

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/wasmtools/wasmtools/sandbox"
)

// Catalogue is one immutable set of plugins whose tool names are unique. A
// host serves one catalogue at a time and swaps in a new one on reload.
type Catalogue struct {
	plugins   []*Plugin
	tools     map[string]*Tool
	names     []string
	prompts   map[string]*Prompt
	resources map[string]*Resource
	templates map[string]*ResourceTemplate
}

// Rejected is a plugin a catalogue refused, and why.
type Rejected struct {
	Plugin *Plugin
	Err    error
}

// NewCatalogue builds a catalogue from plugins, taken in order. A plugin
// whose name or any of whose tool names is already taken by an earlier
// plugin is refused whole, never shadowed, and returned with an error
// naming both; the caller closes it.
func NewCatalogue(plugins []*Plugin) (*Catalogue, []Rejected) {
	c := &Catalogue{tools: map[string]*Tool{}, prompts: map[string]*Prompt{}, resources: map[string]*Resource{}, templates: map[string]*ResourceTemplate{}}
	byName := map[string]*Plugin{}
	var rejected []Rejected
	for _, p := range plugins {
		if prev, ok := byName[p.name]; ok {
			rejected = append(rejected, Rejected{p, fmt.Errorf("plugin %q (%s): the name is taken by %s: rename one file", p.name, p.path, prev.path)})
			continue
		}
		var clash []string
		for _, t := range p.tools {
			if prev, ok := c.tools[t.Name]; ok {
				clash = append(clash, fmt.Sprintf("%q is served by plugin %q (%s)", t.Name, prev.plugin.name, prev.plugin.path))
			}
		}
		for _, pr := range p.prompts {
			if prev, ok := c.prompts[pr.Name]; ok {
				clash = append(clash, fmt.Sprintf("prompt %q is served by plugin %q (%s)", pr.Name, prev.plugin.name, prev.plugin.path))
			}
		}
		for _, r := range p.resources {
			if prev, ok := c.resources[r.URI]; ok {
				clash = append(clash, fmt.Sprintf("resource %q is served by plugin %q (%s)", r.URI, prev.plugin.name, prev.plugin.path))
			}
		}
		for _, r := range p.templates {
			if prev, ok := c.templates[r.URITemplate]; ok {
				clash = append(clash, fmt.Sprintf("resource template %q is served by plugin %q (%s)", r.URITemplate, prev.plugin.name, prev.plugin.path))
			}
		}
		if len(clash) > 0 {
			rejected = append(rejected, Rejected{p, fmt.Errorf("plugin %q (%s): tool name collision: %s; give one plugin a prefix", p.name, p.path, strings.Join(clash, ", "))})
			continue
		}
		byName[p.name] = p
		c.plugins = append(c.plugins, p)
		for _, t := range p.tools {
			c.tools[t.Name] = t
			c.names = append(c.names, t.Name)
		}
		for _, pr := range p.prompts {
			c.prompts[pr.Name] = pr
		}
		for _, r := range p.resources {
			c.resources[r.URI] = r
		}
		for _, r := range p.templates {
			c.templates[r.URITemplate] = r
		}
	}
	sort.Strings(c.names)
	slices.SortFunc(c.plugins, func(a, b *Plugin) int { return strings.Compare(a.name, b.name) })
	return c, rejected
}

// claim is one name a plugin serves under, unique across a catalogue.
type claim struct{ kind, name string }

// claims lists every name p serves under: its own name, and its tools',
// prompts', resources' and resource templates'.
func claims(p *Plugin) []claim {
	out := []claim{{"plugin", p.name}}
	for _, t := range p.tools {
		out = append(out, claim{"tool", t.Name})
	}
	for _, pr := range p.prompts {
		out = append(out, claim{"prompt", pr.Name})
	}
	for _, r := range p.resources {
		out = append(out, claim{"resource", r.URI})
	}
	for _, r := range p.templates {
		out = append(out, claim{"resource template", r.URITemplate})
	}
	return out
}

// next builds the catalogue that follows c: the plugins in remove leave,
// each key of replace is replaced by its value (a new version, or the same
// code with new lists), and the plugins of add join.
//
// A plugin already served keeps every name it serves under, whatever the
// newcomer: a replacement or addition that claims a name held by another
// served plugin is refused whole (the version it would replace goes on
// serving), with an error naming both. Names no served plugin holds go to
// the first claimant, replacements (in c's order) before additions (in
// the order given). The caller closes the refused plugins.
func (c *Catalogue) next(replace map[*Plugin]*Plugin, add []*Plugin, remove map[*Plugin]bool) (*Catalogue, []Rejected) {
	owner := map[claim]*Plugin{} // held by a served plugin that stays
	for _, p := range c.plugins {
		if remove[p] {
			continue
		}
		for _, cl := range claims(p) {
			owner[cl] = p
		}
	}
	var rejected []Rejected
	taken := map[claim]*Plugin{} // taken by a newcomer accepted earlier
	try := func(q, replaces *Plugin) bool {
		var clash []string
		for _, cl := range claims(q) {
			by := owner[cl]
			if by == nil || by == replaces {
				by = taken[cl]
			}
			if by == nil || by == replaces {
				continue
			}
			if cl.kind == "plugin" {
				rejected = append(rejected, Rejected{q, fmt.Errorf("plugin %q (%s): the name is taken by %s: rename one file", q.name, q.path, by.path)})
				return false
			}
			what := fmt.Sprintf("%s %q", cl.kind, cl.name)
			if cl.kind == "tool" {
				what = fmt.Sprintf("%q", cl.name) // as NewCatalogue says it
			}
			clash = append(clash, fmt.Sprintf("%s is served by plugin %q (%s)", what, by.name, by.path))
		}
		if len(clash) > 0 {
			rejected = append(rejected, Rejected{q, fmt.Errorf("plugin %q (%s): tool name collision: %s; give one plugin a prefix", q.name, q.path, strings.Join(clash, ", "))})
			return false
		}
		for _, cl := range claims(q) {
			taken[cl] = q
		}
		return true
	}
	var list []*Plugin
	for _, p := range c.plugins {
		if remove[p] {
			continue
		}
		if q, ok := replace[p]; ok && try(q, p) {
			list = append(list, q)
			continue
		}
		list = append(list, p)
	}
	for _, q := range add {
		if try(q, nil) {
			list = append(list, q)
		}
	}
	next, more := NewCatalogue(list)
	return next, append(rejected, more...) // more is empty: every claim was checked
}

// Tool returns the tool served under name.
func (c *Catalogue) Tool(name string) (*Tool, bool) {
	t, ok := c.tools[name]
	return t, ok
}

// Tools returns every tool, sorted by name.
func (c *Catalogue) Tools() []*Tool {
	ts := make([]*Tool, len(c.names))
	for i, n := range c.names {
		ts[i] = c.tools[n]
	}
	return ts
}

// Prompt returns the prompt served under name.
func (c *Catalogue) Prompt(name string) (*Prompt, bool) {
	p, ok := c.prompts[name]
	return p, ok
}

// Resource returns the resource served at uri.
func (c *Catalogue) Resource(uri string) (*Resource, bool) {
	r, ok := c.resources[uri]
	return r, ok
}

// ResourceTemplate returns the template served as uriTemplate.
func (c *Catalogue) ResourceTemplate(uriTemplate string) (*ResourceTemplate, bool) {
	r, ok := c.templates[uriTemplate]
	return r, ok
}

// Plugins returns the catalogue's plugins, sorted by name.
func (c *Catalogue) Plugins() []*Plugin { return slices.Clone(c.plugins) }

// Close closes every plugin in the catalogue.
func (c *Catalogue) Close(ctx context.Context) error {
	var errs []error
	for _, p := range c.plugins {
		errs = append(errs, p.Close(ctx))
	}
	return errors.Join(errs...)
}

// Discover expands paths into the plugin files they name: a folder gives
// the *.wasm files directly in it, sorted; a file is taken as it is, in the
// order given. A path that does not exist is an error; the rest are still
// returned.
func Discover(paths []string) ([]string, []error) {
	var files []string
	var errs []error
	seen := map[string]bool{}
	add := func(f string) {
		if abs, err := filepath.Abs(f); err == nil && !seen[abs] {
			seen[abs] = true
			files = append(files, f)
		}
	}
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("plugin path %s: %w", p, err))
			continue
		}
		if !info.IsDir() {
			add(p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("plugin folder %s: %w", p, err))
			continue
		}
		for _, e := range entries {
			switch {
			case !IsPluginFile(e.Name()):
			case e.Type()&fs.ModeType == 0, e.Type()&fs.ModeSymlink != 0:
				add(filepath.Join(p, e.Name())) // a link is followed only to a regular file (see readPluginFile)
			default:
				errs = append(errs, fmt.Errorf("plugin file %s: not a regular file (%s): skipped", filepath.Join(p, e.Name()), e.Type()))
			}
		}
	}
	return files, errs
}

// IsPluginFile reports whether a file in a plugin folder is a plugin by its
// name: it ends in ".wasm" and is not hidden (editors and deploy tools
// write hidden temporary files).
func IsPluginFile(name string) bool {
	return strings.HasSuffix(name, ".wasm") && !strings.HasPrefix(name, ".")
}

// LoadAll loads every plugin file that paths name (see [Discover]) and
// builds a catalogue of those that load and do not collide. Each failure is
// returned as an error naming the file and the reason; the rest are served.
// optsFor gives each file's options, and may be nil.
func LoadAll(ctx context.Context, rt *sandbox.Runtime, paths []string, optsFor func(path string) Options) (*Catalogue, []error) {
	files, errs := Discover(paths)
	var loaded []*Plugin
	for _, f := range files {
		wasm, err := readPluginFile(f, maxFileSize(optsFor, f))
		if err != nil {
			errs = append(errs, fmt.Errorf("plugin file %s: %w", f, err))
			continue
		}
		var opts Options
		if optsFor != nil {
			opts = optsFor(f)
		}
		p, err := Load(ctx, rt, f, wasm, opts)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		loaded = append(loaded, p)
	}
	cat, rejected := NewCatalogue(loaded)
	for _, r := range rejected {
		errs = append(errs, r.Err)
		_ = r.Plugin.Close(ctx)
	}
	return cat, errs
}
