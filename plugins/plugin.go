// Package plugins turns .wasm files into plugins the host can serve: it
// loads and checks them (interface, tools, schemas), builds the catalogue
// of tools they offer with collisions refused, and makes instances that
// call their tools.
//
// A [Plugin] is one loaded file: its bytes' sha256, its compiled module and
// its tools. A [Catalogue] is one immutable set of plugins with unique tool
// names. An [Instance] is one live sandbox of a plugin; the host keeps one
// per MCP session.
package plugins

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/yosida95/uritemplate/v3"
	"go.opentelemetry.io/otel/attribute"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Options configures how one plugin is loaded. The zero value loads with
// sandbox defaults and no prefix.
type Options struct {
	// Name is the plugin's name; "" means the file's base name without
	// ".wasm".
	Name string
	// Prefix is prepended verbatim to each tool name the plugin lists, so
	// that two plugins with the same tool names can both be served.
	Prefix string
	// Policy is what the plugin's instances may do. nil means
	// sandbox.NewPolicy().
	Policy *sandbox.Policy
	// Tools filters the tools served, by the plugin's own tool names.
	Tools ToolFilter
	// Skip leaves out prompts, resources and resource templates, as
	// hyper-mcp's skip_prompts, skip_resources and
	// skip_resource_templates do.
	Skip Skip
	// Disabled keeps the plugin from loading; a reloader reports it as
	// disabled.
	Disabled bool
	// Stateless declares that the plugin keeps no state between calls, so
	// its calls may share a pool of warm instances instead of one instance
	// per session. A plugin can declare it itself with a custom section
	// named [StatelessSection].
	Stateless bool
	// Secrets are the keyring secrets granted to the plugin (hyper-mcp's
	// get_keyring_secret), keyed "service/user": the service is the part
	// before the first "/".
	Secrets map[string]string
	// AccessTokens are OAuth access tokens the operator gives the plugin
	// (hyper-mcp's get_access_token), keyed by OAuth client_id.
	AccessTokens map[string]string
	// AskSecrets are keyring secrets, keyed as Secrets, that the plugin
	// may be given at run time once the client's user agrees (the host
	// asks); see [Plugin.AskSecret].
	AskSecrets map[string]string
}

// ManifestSection is the name of the custom section in which a plugin
// may say what it needs (a JSON [Manifest]). It requests nothing by
// itself: the operator grants, and `wasmtools inspect` shows the two side
// by side.
const ManifestSection = "wasmtools.manifest"

// Manifest is what a plugin says it needs.
type Manifest struct {
	Hosts  []string `json:"hosts,omitempty"`
	Paths  []string `json:"paths,omitempty"`
	Config []string `json:"config,omitempty"`
	Env    []string `json:"env,omitempty"`
}

// Manifest returns what the plugin says it needs, from its
// [ManifestSection], or nil.
func (p *Plugin) Manifest() (*Manifest, error) {
	b := p.compiled.CustomSection(ManifestSection)
	if b == nil {
		return nil, nil
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s section: %w", ManifestSection, err)
	}
	return &m, nil
}

// ToolFilter selects tools by name with path.Match patterns (* and ?): a
// tool is served if it matches an Allow pattern (or there are none), no
// Deny pattern and no DenyRegexp. The zero value serves every tool.
type ToolFilter struct {
	Allow, Deny []string
	// DenyRegexp are regular expressions (RE2), each anchored to match the
	// whole name (hyper-mcp's skip_tools); one that does not compile
	// matches nothing (the configuration checks them).
	DenyRegexp []string
}

// Skip holds regular expressions (RE2), each anchored to match the whole
// string as hyper-mcp anchors them: a prompt whose own name (before any
// prefix), a resource whose URI, or a template whose URI template matches
// one is not served. One that does not compile matches nothing (the
// configuration checks them). The zero value skips nothing.
type Skip struct {
	Prompts, Resources, ResourceTemplates []string
}

// skips reports whether s matches one of res, each anchored.
func skips(res []string, s string) bool {
	for _, re := range res {
		if r, err := regexp.Compile(`^(?:` + re + `)$`); err == nil && r.MatchString(s) {
			return true
		}
	}
	return false
}

// Serves reports whether the filter lets tool name through.
func (f ToolFilter) Serves(name string) bool {
	match := func(pats []string) bool {
		for _, p := range pats {
			if ok, _ := path.Match(p, name); ok {
				return true
			}
		}
		return false
	}
	if skips(f.DenyRegexp, name) {
		return false
	}
	return (len(f.Allow) == 0 || match(f.Allow)) && !match(f.Deny)
}

// StatelessSection is the name of the custom section by which a plugin
// declares that it keeps no state between calls (its contents are
// ignored, but give it at least one byte: wazero v1.12 refuses an empty
// custom section at the end of a module). With it, the host serves the plugin's calls from a shared pool
// of warm instances. A plugin that declares it falsely leaks state between
// clients: the operator's Options.Stateless is the same promise, made on
// the plugin's behalf.
const StatelessSection = "wasmtools.stateless"

// Plugin is one loaded, checked plugin. It is safe for concurrent use.
// Close it when it is no longer served; that closes its instances.
type Plugin struct {
	name      string
	path      string
	sha256    string
	size      int
	iface     abi.Interface
	tools     []*Tool
	prompts   []*Prompt
	resources []*Resource
	templates []*ResourceTemplate
	compiled  *sandbox.Compiled
	hasExport map[string]bool
	stateless bool
	// Grants served by host functions (see Options).
	secrets, accessTokens map[string]string
	askSecrets            map[string]string
	asks                  bool // see Asks
	prefix                string
	filter                ToolFilter
	skip                  Skip
	closed                atomic.Bool
}

// Tool is one tool a plugin serves.
type Tool struct {
	// Name is the tool's name as served: the plugin's prefix and its own
	// name.
	Name string
	// Def is the tool as the plugin lists it, under its own name.
	Def    abi.Tool
	plugin *Plugin
	schema *inputSchema
}

// Plugin returns the plugin that serves t.
func (t *Tool) Plugin() *Plugin { return t.plugin }

// Prompt is one prompt a plugin serves (v2 interface).
type Prompt struct {
	// Name is the name served: the plugin's prefix and its own name.
	Name string
	// OwnName is the name the plugin knows it by.
	OwnName string
	// Def is the MCP Prompt object, under the served name.
	Def    json.RawMessage
	plugin *Plugin
}

// Plugin returns the plugin that serves the prompt.
func (p *Prompt) Plugin() *Plugin { return p.plugin }

// Resource is one resource a plugin serves (v2 interface).
type Resource struct {
	URI    string
	Def    json.RawMessage // the MCP Resource object
	plugin *Plugin
}

// Plugin returns the plugin that serves the resource.
func (r *Resource) Plugin() *Plugin { return r.plugin }

// ResourceTemplate is one resource template a plugin serves.
type ResourceTemplate struct {
	URITemplate string
	Def         json.RawMessage // the MCP ResourceTemplate object
	plugin      *Plugin

	once sync.Once
	re   *regexp.Regexp // the template's, compiled on first use; nil if it does not parse
}

// Plugin returns the plugin that serves the template.
func (r *ResourceTemplate) Plugin() *Plugin { return r.plugin }

// Matches reports whether uri is one of the template's URIs (RFC 6570,
// as the go-sdk matches a read's URI). A template that does not parse
// matches nothing. The template is compiled once, on first use.
func (r *ResourceTemplate) Matches(uri string) bool {
	r.once.Do(func() {
		if t, err := uritemplate.New(r.URITemplate); err == nil {
			r.re = t.Regexp()
		}
	})
	return r.re != nil && r.re.MatchString(uri)
}

// MatchesTemplate reports whether uri matches one of p's resource
// templates ([ResourceTemplate.Matches]).
func (p *Plugin) MatchesTemplate(uri string) bool {
	for _, rt := range p.templates {
		if rt.Matches(uri) {
			return true
		}
	}
	return false
}

// ValidName is what a served tool name must match: model providers refuse
// other names.
var validName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// ErrInvalidArguments is matched by the error of [Tool.ValidateArguments].
var ErrInvalidArguments = errors.New("invalid arguments")

// jsonSpace is the whitespace JSON allows around a value.
const jsonSpace = " \t\n\r"

// ValidateArguments checks args against the tool's input schema. The error
// says what is wrong, for the calling model to read, and matches
// [ErrInvalidArguments]. Arguments over [MaxArgumentBytes] or nested
// deeper than [MaxArgumentDepth] are refused unread, and so are arguments
// with too many values for the schema's cost per value, which was bounded
// when the schema was loaded.
func (t *Tool) ValidateArguments(args json.RawMessage) error {
	if err := t.schema.checkArguments(args); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArguments, err)
	}
	// The common cases, without decoding: no arguments, whose verdict was
	// found when the schema was compiled, and arguments a flat schema
	// proves valid (see flatSchema; what it does not prove goes on).
	trimmed := bytes.Trim(args, jsonSpace) // JSON's whitespace only: "\f{}" is not JSON
	if len(trimmed) == 0 || string(trimmed) == "null" || string(trimmed) == "{}" {
		if err := t.schema.emptyErr; err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidArguments, err)
		}
		return nil
	}
	if t.schema.flat != nil && t.schema.flat.valid(args) {
		return nil
	}
	var v any = map[string]any{}
	if len(trimmed) > 0 && string(trimmed) != "null" {
		if err := json.Unmarshal(args, &v); err != nil {
			return fmt.Errorf("%w: not JSON: %v", ErrInvalidArguments, err)
		}
	}
	if _, ok := v.(map[string]any); !ok {
		return fmt.Errorf("%w: arguments must be a JSON object", ErrInvalidArguments)
	}
	if err := t.schema.Validate(v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArguments, err)
	}
	return nil
}

// Load checks and compiles wasm, the bytes of the file at path, and asks the
// plugin for its tools in a throwaway instance. It fails, with the reason in
// the error, for bytes that are not a compilable module, imports the host
// does not provide, a module that exports neither plugin interface, a tool
// list that does not decode or is over a list limit (see [MaxListItems]),
// an invalid or duplicate tool name, or an input schema that does not
// compile. Compiling is bounded by the policy's compile timeout; what
// follows (instantiating, listing) by its load timeout, an overrun failing
// with an error matching context.DeadlineExceeded.
func Load(ctx context.Context, rt *sandbox.Runtime, path string, wasm []byte, opts Options) (*Plugin, error) {
	return load(ctx, rt, path, wasm, opts, nil)
}

// load is [Load]; onCompiled, if set, is called once the module compiled,
// before any guest code runs.
func load(ctx context.Context, rt *sandbox.Runtime, path string, wasm []byte, opts Options, onCompiled func()) (_ *Plugin, err error) {
	name := cmp.Or(opts.Name, strings.TrimSuffix(filepath.Base(path), ".wasm"))
	sum := sha256.Sum256(wasm)
	p := &Plugin{name: name, path: path, sha256: hex.EncodeToString(sum[:]), size: len(wasm), hasExport: map[string]bool{}}
	ctx, span := telemetry.Start(ctx, "wasmtools.load", attribute.String("wasmtools.plugin", name), attribute.String("wasmtools.plugin.sha256", p.sha256), attribute.Int("wasmtools.plugin.size", len(wasm)))
	defer func() { telemetry.End(span, err) }()
	policy := sandbox.NewPolicy()
	if opts.Policy != nil {
		policy = *opts.Policy
	}
	cctx, cspan := telemetry.Start(ctx, "wasmtools.compile")
	compiled, err := rt.Compile(cctx, wasm, policy)
	telemetry.End(cspan, err)
	if err != nil {
		return nil, fmt.Errorf("plugin %q (%s): %w", name, path, err)
	}
	if onCompiled != nil {
		onCompiled()
	}
	p.compiled = compiled
	p.stateless = opts.Stateless || compiled.CustomSection(StatelessSection) != nil
	p.filter, p.skip = opts.Tools, opts.Skip
	p.secrets, p.accessTokens = maps.Clone(opts.Secrets), maps.Clone(opts.AccessTokens)
	p.askSecrets = maps.Clone(opts.AskSecrets)
	p.asks = len(p.askSecrets) > 0 || len(policy.Network().Ask) > 0 || len(policy.AskMounts()) > 0
	if err := p.describe(ctx, opts.Prefix, policy.LoadTimeout()); err != nil {
		err = fmt.Errorf("plugin %q (%s): %w", name, path, err)
		if cerr := compiled.Close(ctx); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, err
	}
	return p, nil
}

// describe detects the interface and reads the tool list, within timeout
// (zero or less meaning sandbox.DefaultLoadTimeout).
func (p *Plugin) describe(ctx context.Context, prefix string, timeout time.Duration) error {
	if err := p.detectInterface(); err != nil {
		return err
	}
	if timeout <= 0 {
		timeout = sandbox.DefaultLoadTimeout
	}
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := func() error {
		inst, err := p.compiled.Instantiate(lctx)
		if err != nil {
			return err
		}
		defer inst.Close(ctx)
		if err := p.describeWith(lctx, inst, prefix); err != nil {
			return err
		}
		// Listing the tools ran the guest once, with nothing of any
		// client's: its state now is a better image than the one
		// right after initialisation (see sandbox.Instance.KeepImage).
		inst.KeepImage()
		return nil
	}()
	if err != nil && ctx.Err() == nil && errors.Is(lctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("took longer than the load timeout of %v: %w", timeout, err)
	}
	return err
}

// describeWith reads the tool list from inst and checks it.
func (p *Plugin) describeWith(ctx context.Context, inst *sandbox.Instance, prefix string) error {
	p.prefix = prefix
	if err := p.detectInterface(); err != nil {
		return err
	}
	defs, err := p.listTools(ctx, inst)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, d := range defs {
		if !p.filter.Serves(d.Name) {
			continue
		}
		served := prefix + d.Name
		if !validName.MatchString(served) {
			return fmt.Errorf("tool name %q is not allowed: names must match %s", served, validName)
		}
		if seen[served] {
			return fmt.Errorf("lists tool %q twice", served)
		}
		seen[served] = true
		t := &Tool{Name: served, Def: d, plugin: p}
		if len(d.InputSchema) == 0 {
			t.Def.InputSchema = json.RawMessage(`{"type":"object"}`)
		}
		if t.schema, err = compileSchema(t.Def.InputSchema); err != nil {
			return fmt.Errorf("tool %q: input schema: %w", d.Name, err)
		}
		if err := checkReserved(t.Def.InputSchema); err != nil {
			return fmt.Errorf("tool %q: input schema: %w", d.Name, err)
		}
		if rc := d.RequiredClientCapabilities; len(rc) > 0 {
			var caps map[string]any
			if err := json.Unmarshal(rc, &caps); err != nil || caps == nil {
				return fmt.Errorf("tool %q: requiredClientCapabilities must be an object of capabilities", d.Name)
			}
		}
		if e := d.Execution; e != nil {
			switch e.TaskSupport {
			case "", abi.TaskForbidden, abi.TaskOptional, abi.TaskRequired:
			default:
				return fmt.Errorf("tool %q: execution.taskSupport %q is not forbidden, optional or required", d.Name, e.TaskSupport)
			}
		}
		p.tools = append(p.tools, t)
	}
	return p.describeMore(ctx, inst, prefix)
}

// describeMore reads the prompts, resources and resource templates of a v2
// plugin that exports them.
func (p *Plugin) describeMore(ctx context.Context, inst *sandbox.Instance, prefix string) error {
	if p.iface != abi.InterfaceV2 {
		return nil
	}
	if p.hasExport[abi.ExportListPrompts] {
		defs, err := listPages(ctx, inst, abi.ExportListPrompts, "prompts", func(b []byte) ([]json.RawMessage, string, error) {
			var r abi.ListPromptsResult
			err := decodeJSON(b, &r)
			return r.Prompts, r.NextCursor, err
		})
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, d := range defs {
			var head map[string]any
			if err := json.Unmarshal(d, &head); err != nil {
				return fmt.Errorf("prompt: %w", err)
			}
			own, _ := head["name"].(string)
			if skips(p.skip.Prompts, own) {
				continue
			}
			served := prefix + own
			if !validName.MatchString(served) || seen[served] {
				return fmt.Errorf("prompt name %q is not allowed or listed twice: names must match %s", served, validName)
			}
			seen[served] = true
			head["name"] = served
			def, _ := json.Marshal(head)
			p.prompts = append(p.prompts, &Prompt{Name: served, OwnName: own, Def: def, plugin: p})
		}
	}
	if p.hasExport[abi.ExportListResources] {
		defs, err := listPages(ctx, inst, abi.ExportListResources, "resources", func(b []byte) ([]json.RawMessage, string, error) {
			var r abi.ListResourcesResult
			err := decodeJSON(b, &r)
			return r.Resources, r.NextCursor, err
		})
		if err != nil {
			return err
		}
		for _, d := range defs {
			var head struct {
				URI string `json:"uri"`
			}
			if err := json.Unmarshal(d, &head); err != nil || head.URI == "" {
				return fmt.Errorf("resource without a uri: %s", d)
			}
			if skips(p.skip.Resources, head.URI) {
				continue
			}
			p.resources = append(p.resources, &Resource{URI: head.URI, Def: d, plugin: p})
		}
	}
	if p.hasExport[abi.ExportListResourceTemplates] {
		defs, err := listPages(ctx, inst, abi.ExportListResourceTemplates, "resource templates", func(b []byte) ([]json.RawMessage, string, error) {
			var r abi.ListResourceTemplatesResult
			err := decodeJSON(b, &r)
			return r.ResourceTemplates, r.NextCursor, err
		})
		if err != nil {
			return err
		}
		for _, d := range defs {
			var head struct {
				URITemplate string `json:"uriTemplate"`
			}
			if err := json.Unmarshal(d, &head); err != nil || head.URITemplate == "" {
				return fmt.Errorf("resource template without a uriTemplate: %s", d)
			}
			if skips(p.skip.ResourceTemplates, head.URITemplate) {
				continue
			}
			p.templates = append(p.templates, &ResourceTemplate{URITemplate: head.URITemplate, Def: d, plugin: p})
		}
	}
	return nil
}

// Bounds on each list a plugin gives when it is loaded (its tools, and a
// v2 plugin's prompts, resources and resource templates), each list on its
// own. Loading refuses a plugin over one, naming it. A tool list of
// 100 001 tools took 9 s and 682 MiB to load, and 99 pages of 4 MB each
// 2.3 GiB; MCP servers list tens of tools, rarely hundreds.
const (
	// MaxListItems bounds the items of one list.
	MaxListItems = 2000
	// MaxListBytes bounds the bytes of one list, all pages together.
	MaxListBytes = 8 << 20
	// MaxListPages bounds the pages of one v2 list, so that a plugin that
	// always returns a next cursor cannot hold the load.
	MaxListPages = 32
)

// listPages calls a v2 list export page by page, passing each cursor back,
// within the list limits. kind names the items in errors.
func listPages[T any](ctx context.Context, inst *sandbox.Instance, export, kind string, decode func([]byte) ([]T, string, error)) ([]T, error) {
	var all []T
	total := 0
	in := abi.ListInput{Context: abi.CallContext{ID: 0, Meta: json.RawMessage(`{}`)}}
	for page := 1; page <= MaxListPages; page++ {
		b, _ := json.Marshal(in)
		out, err := inst.Call(ctx, export, b, nil)
		if err != nil {
			return nil, err
		}
		if total += len(out); total > MaxListBytes {
			return nil, fmt.Errorf("%s: the %s take more than %d bytes by page %d, over the limit MaxListBytes = %d", export, kind, total, page, MaxListBytes)
		}
		items, next, err := decode(out)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", export, err)
		}
		if err := checkListLen(export, kind, len(all)+len(items)); err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		in.Context.Cursor = next
	}
	return nil, fmt.Errorf("%s: the %s take more than %d pages, over the limit MaxListPages = %d", export, kind, MaxListPages, MaxListPages)
}

func checkListLen(export, kind string, n int) error {
	if n > MaxListItems {
		return fmt.Errorf("%s: at least %d %s, over the limit MaxListItems = %d", export, n, kind, MaxListItems)
	}
	return nil
}

// detectInterface tells the plugin interface from the exports.
func (p *Plugin) detectInterface() error {
	for _, f := range p.compiled.Exports() {
		p.hasExport[f.Name] = true
	}
	switch {
	case p.hasExport[abi.ExportListTools] && p.hasExport[abi.ExportCallTool]:
		p.iface = abi.InterfaceV2
	case p.hasExport[abi.ExportDescribe] && p.hasExport[abi.ExportCall]:
		p.iface = abi.InterfaceServlet
	default:
		return fmt.Errorf("exports neither plugin interface: want %q and %q (v2), or %q and %q (servlet)",
			abi.ExportListTools, abi.ExportCallTool, abi.ExportDescribe, abi.ExportCall)
	}
	return nil
}

func (p *Plugin) listTools(ctx context.Context, inst *sandbox.Instance) ([]abi.Tool, error) {
	if p.iface == abi.InterfaceServlet {
		out, err := inst.Call(ctx, abi.ExportDescribe, nil, nil)
		if err != nil {
			return nil, err
		}
		if len(out) > MaxListBytes {
			return nil, fmt.Errorf("%s: the tools take %d bytes, over the limit MaxListBytes = %d", abi.ExportDescribe, len(out), MaxListBytes)
		}
		var res abi.ServletDescribeResult
		if err := decodeJSON(out, &res); err != nil {
			return nil, fmt.Errorf("%s: %w", abi.ExportDescribe, err)
		}
		if err := checkListLen(abi.ExportDescribe, "tools", len(res.Tools)); err != nil {
			return nil, err
		}
		return res.Tools, nil
	}
	return listPages(ctx, inst, abi.ExportListTools, "tools", func(b []byte) ([]abi.Tool, string, error) {
		var res abi.ListToolsResult
		err := decodeJSON(b, &res)
		return res.Tools, res.NextCursor, err
	})
}

func compileSchema(raw json.RawMessage) (*inputSchema, error) {
	var s jsonschema.Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, err
	}
	// Check the references of the schema as the validator read it:
	// encoding/json matches keys case-insensitively ("$rEf" is a $ref), so
	// the raw text is not what the validator follows.
	canonical, err := json.Marshal(&s)
	if err != nil {
		return nil, err
	}
	var tree any
	if err := json.Unmarshal(canonical, &tree); err != nil {
		return nil, err
	}
	if err := checkRefs(tree); err != nil {
		return nil, err
	}
	cost, err := checkCost(tree)
	if err != nil {
		return nil, err
	}
	if s.Type != "object" {
		return nil, fmt.Errorf(`type is %q, but MCP requires "object"`, s.Type)
	}
	rs, err := s.Resolve(nil)
	if err != nil {
		return nil, err
	}
	return &inputSchema{Resolved: rs, perValue: cost, emptyErr: rs.Validate(map[string]any{}), flat: flatSchemaOf(tree)}, nil
}

// checkRefs refuses the references a validator could follow forever: a
// cycle of $ref through keywords that apply to the same instance (allOf,
// anyOf, oneOf, not, if/then/else, dependentSchemas, $ref itself) would
// make validation recurse without consuming the instance, and a Go stack
// overflow cannot be recovered. References through properties or items
// descend into the instance, which is finite, and are allowed. Only local
// references ("#", "#/$defs/…", "#/definitions/…") are accepted.
func checkRefs(root any) error {
	resolve := func(ref string) (any, error) {
		switch {
		case strings.Contains(ref, "%"):
			// The validator percent-decodes the fragment ("a%62" is
			// "ab"); this walk would not.
			return nil, fmt.Errorf("$ref %q: percent-encoded references are not supported", ref)
		case ref == "#":
			return root, nil
		case strings.HasPrefix(ref, "#/"):
			node := root
			for _, part := range strings.Split(ref[2:], "/") {
				part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
				m, ok := node.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("$ref %q does not resolve", ref)
				}
				if node, ok = m[part]; !ok {
					return nil, fmt.Errorf("$ref %q does not resolve", ref)
				}
			}
			return node, nil
		}
		return nil, fmt.Errorf("$ref %q: only local references (#, #/$defs/…) are allowed", ref)
	}
	// inPlace lists the references node reaches without descending into
	// the instance.
	var inPlace func(node any, refs *[]string) error
	inPlace = func(node any, refs *[]string) error {
		m, ok := node.(map[string]any)
		if !ok {
			return nil
		}
		for _, k := range []string{"$dynamicRef", "$recursiveRef"} {
			if _, ok := m[k]; ok {
				return fmt.Errorf("%s is not supported", k)
			}
		}
		if r, ok := m["$ref"].(string); ok {
			*refs = append(*refs, r)
		}
		for _, k := range []string{"allOf", "anyOf", "oneOf"} {
			if list, ok := m[k].([]any); ok {
				for _, sub := range list {
					if err := inPlace(sub, refs); err != nil {
						return err
					}
				}
			}
		}
		for _, k := range []string{"not", "if", "then", "else"} {
			if err := inPlace(m[k], refs); err != nil {
				return err
			}
		}
		if deps, ok := m["dependentSchemas"].(map[string]any); ok {
			for _, sub := range deps {
				if err := inPlace(sub, refs); err != nil {
					return err
				}
			}
		}
		return nil
	}
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var visit func(ref string) error
	visit = func(ref string) error {
		switch state[ref] {
		case onPath:
			return fmt.Errorf("$ref %q leads back to itself without descending into the value: validation would never end", ref)
		case done:
			return nil
		}
		state[ref] = onPath
		node, err := resolve(ref)
		if err != nil {
			return err
		}
		var refs []string
		if err := inPlace(node, &refs); err != nil {
			return err
		}
		for _, r := range refs {
			if err := visit(r); err != nil {
				return err
			}
		}
		state[ref] = done
		return nil
	}
	if err := visit("#"); err != nil {
		return err
	}
	// Every other reference must at least resolve, and start no cycle.
	var all func(node any) error
	all = func(node any) error {
		switch v := node.(type) {
		case map[string]any:
			if r, ok := v["$ref"].(string); ok {
				if err := visit(r); err != nil {
					return err
				}
			}
			for _, sub := range v {
				if err := all(sub); err != nil {
					return err
				}
			}
		case []any:
			for _, sub := range v {
				if err := all(sub); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return all(root)
}

// decodeJSON decodes guest output, refusing invalid UTF-8 and trailing data.
func decodeJSON(b []byte, v any) error {
	if len(b) == 0 {
		return errors.New("empty output, want JSON")
	}
	if !utf8.Valid(b) {
		return errors.New("output is not valid UTF-8")
	}
	// json.Unmarshal refuses anything after the value but JSON's own
	// white space, and needs no decoder buffer.
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("output is not the expected JSON: %w", err)
	}
	return nil
}

// Name returns the plugin's name.
func (p *Plugin) Name() string { return p.name }

// Path returns the file the plugin was loaded from.
func (p *Plugin) Path() string { return p.path }

// SHA256 returns the hex sha256 of the plugin's bytes: its version.
func (p *Plugin) SHA256() string { return p.sha256 }

// Size returns the plugin's size in bytes.
func (p *Plugin) Size() int { return p.size }

// Interface returns the plugin interface the plugin speaks.
func (p *Plugin) Interface() abi.Interface { return p.iface }

// Tools returns the plugin's tools in the order it lists them. The slice
// must not be modified.
func (p *Plugin) Tools() []*Tool { return p.tools }

// Prompts, Resources and ResourceTemplates return what a v2 plugin serves
// besides tools. The slices must not be modified.
func (p *Plugin) Prompts() []*Prompt                     { return p.prompts }
func (p *Plugin) Resources() []*Resource                 { return p.resources }
func (p *Plugin) ResourceTemplates() []*ResourceTemplate { return p.templates }

// HasExport reports whether the plugin exports function name.
func (p *Plugin) HasExport(name string) bool { return p.hasExport[name] }

// ImportsHost reports whether the plugin imports the extism:host/user
// function name (see [abi.UserFuncs]).
func (p *Plugin) ImportsHost(name string) bool { return p.compiled.ImportsFunc(abi.UserModule, name) }

// SameCode reports whether q runs the same compiled module as p: an
// instance of one serves the other. [Plugin.Relist] keeps the code; a
// reload from a file makes new code.
func (p *Plugin) SameCode(q *Plugin) bool { return p.compiled == q.compiled }

// Relist asks instance inst of the plugin for its tools again (the guest
// said its list changed) and returns a plugin with the new list and the
// same code, so that instances of p serve it. p is not changed. The list
// limits and the policy's load timeout apply, as in [Load].
func (p *Plugin) Relist(ctx context.Context, inst *Instance) (*Plugin, error) {
	q := &Plugin{name: p.name, path: p.path, sha256: p.sha256, size: p.size, compiled: p.compiled, hasExport: map[string]bool{}, stateless: p.stateless, filter: p.filter, skip: p.skip,
		secrets: p.secrets, accessTokens: p.accessTokens, askSecrets: p.askSecrets, asks: p.asks}
	if d := p.compiled.Policy().LoadTimeout(); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	if err := q.describeWith(ctx, inst.sb, p.prefix); err != nil {
		return nil, fmt.Errorf("plugin %q (%s): list tools again: %w", p.name, p.path, err)
	}
	return q, nil
}

// sameLists reports whether q serves exactly what p serves: the same
// tools, prompts, resources and templates, with the same definitions.
func (p *Plugin) sameLists(q *Plugin) bool {
	lists := func(p *Plugin) []byte {
		defs := []any{}
		for _, t := range p.tools {
			defs = append(defs, t.Name, t.Def)
		}
		for _, pr := range p.prompts {
			defs = append(defs, pr.Name, pr.Def)
		}
		for _, r := range p.resources {
			defs = append(defs, r.URI, r.Def)
		}
		for _, r := range p.templates {
			defs = append(defs, r.URITemplate, r.Def)
		}
		b, _ := json.Marshal(defs)
		return b
	}
	return bytes.Equal(lists(p), lists(q))
}

// Prefix returns the prefix the plugin's tool names were given.
func (p *Plugin) Prefix() string { return p.prefix }

// MemoryLimit reports the memory limit of each of the plugin's instances.
func (p *Plugin) MemoryLimit() uint64 { return p.compiled.Policy().MemoryLimit() }

// HandsOffState reports whether the plugin exports the state handoff pair
// ([abi.ExportSnapshot] and [abi.ExportRestore]).
func (p *Plugin) HandsOffState() bool {
	return p.compiled.HasExport(abi.ExportSnapshot) && p.compiled.HasExport(abi.ExportRestore)
}

// CanSnapshot reports whether the host can snapshot the plugin's
// instances itself ([sandbox.Compiled.CanSnapshot]): nil, or an error
// matching [sandbox.ErrSnapshotRefused] that says why not.
func (p *Plugin) CanSnapshot() error { return p.compiled.CanSnapshot() }

// UsesImages reports whether the plugin's new instances start from a
// pre-initialised image ([sandbox.Compiled.UsesImages]), and if not, why
// not.
func (p *Plugin) UsesImages() (bool, string) { return p.compiled.UsesImages() }

// CarriesStateTo reports whether an instance's state can move from p to
// next: by a host snapshot when both are the same code (the same sha256,
// as after a configuration change) and the host can snapshot it, else by
// the guest's own handoff pair when both versions export it.
func (p *Plugin) CarriesStateTo(next *Plugin) bool {
	if p.sha256 == next.sha256 && p.CanSnapshot() == nil && next.CanSnapshot() == nil {
		return true
	}
	return p.HandsOffState() && next.HandsOffState()
}

// Stateless reports whether the plugin keeps no state between calls (see
// [StatelessSection]).
func (p *Plugin) Stateless() bool { return p.stateless }

// Contained reports whether a call of the plugin can have no effect
// outside its instance (but lines in the host's log): it calls no host
// function of the host's own, reaches no network or folder, and asks for
// no grant ([sandbox.Compiled.Contained]). The host may run such a call
// before it knows the instance is current, and run it again if it was not.
func (p *Plugin) Contained() bool { return !p.asks && p.compiled.Contained() }

// Secret returns the keyring secret granted to the plugin for service and
// user, if any.
func (p *Plugin) Secret(service, user string) (string, bool) {
	if strings.Contains(service, "/") {
		return "", false // "a/b" + "c" would read the grant "a/b/c" of service "a"
	}
	v, ok := p.secrets[service+"/"+user]
	return v, ok
}

// AskSecret returns the keyring secret for service and user that the
// plugin may be given once the client's user agrees, if the operator's
// ceiling has it.
func (p *Plugin) AskSecret(service, user string) (string, bool) {
	if strings.Contains(service, "/") {
		return "", false
	}
	v, ok := p.askSecrets[service+"/"+user]
	return v, ok
}

// Asks reports whether the operator's ceiling lets the plugin ask for
// grants at run time (network hosts, folders or secrets): such a plugin's calls run
// as calls that may ask questions do.
func (p *Plugin) Asks() bool { return p.asks }

// AccessToken returns the access token the operator gave the plugin for
// the OAuth client clientID, if any.
func (p *Plugin) AccessToken(clientID string) (string, bool) {
	v, ok := p.accessTokens[clientID]
	return v, ok
}

// Imports lists what the module imports.
func (p *Plugin) Imports() []sandbox.Func { return p.compiled.Imports() }

// Exports lists what the module exports.
func (p *Plugin) Exports() []sandbox.Func { return p.compiled.Exports() }

// Close closes the plugin's compiled module and every instance of it. It is
// idempotent.
func (p *Plugin) Close(ctx context.Context) error {
	p.closed.Store(true)
	return p.compiled.Close(ctx)
}

// Closed reports whether Close was called on this Plugin or on another
// with the same code ([Plugin.SameCode], as [Plugin.Relist] returns),
// after which its instances cannot run. Safe for concurrent use.
func (p *Plugin) Closed() bool { return p.closed.Load() || p.compiled.Closed() }

// HTTPClient returns an HTTP client for a request the host makes to rawURL
// on the plugin's behalf, under the plugin's network grant (see
// [sandbox.Compiled.HTTPClient]).
func (p *Plugin) HTTPClient(rawURL string) (*http.Client, error) {
	return p.compiled.HTTPClient(rawURL)
}
