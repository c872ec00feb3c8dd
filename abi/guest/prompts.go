//go:build wasip1

package guest

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/wasmtools/wasmtools/abi"
)

// Prompts, resources and completion (the v2 interface's optional exports).
// Results are MCP JSON objects: build them with the types below, or any
// value that marshals to the MCP shape.

// Prompt is one prompt the plugin serves.
type Prompt struct {
	Name        string           `json:"name"`
	Title       string           `json:"title,omitempty"`
	Description string           `json:"description,omitempty"`
	Arguments   []PromptArgument `json:"arguments,omitempty"`
	// Get builds the prompt from the client's arguments. It returns an
	// MCP GetPromptResult.
	Get func(args map[string]string) (*PromptResult, error) `json:"-"`
	// Complete, if set, suggests values for an argument being typed.
	Complete func(argument, value string, context map[string]string) []string `json:"-"`
}

// PromptArgument is one argument of a prompt.
type PromptArgument struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Required    bool   `json:"required,omitempty"`
}

// PromptResult is an MCP GetPromptResult.
type PromptResult struct {
	Description string          `json:"description,omitempty"`
	Messages    []PromptMessage `json:"messages"`
}

// PromptMessage is one message of a prompt; Content is an MCP content
// block, such as TextBlock("...").
type PromptMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

// TextBlock is an MCP text content block.
func TextBlock(s string) abi.TextContent { return abi.TextContent{Type: "text", Text: s} }

// Resource is one resource the plugin serves, or, with a URITemplate
// such as "test://items/{id}", a family of them.
type Resource struct {
	URI         string `json:"uri,omitempty"`
	URITemplate string `json:"uriTemplate,omitempty"`
	Name        string `json:"name"`
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	MIMEType    string `json:"mimeType,omitempty"`
	// Read returns the contents at uri (for a template, any URI it
	// matches, with its variables in vars).
	Read func(uri string, vars map[string]string) ([]ResourceContents, error) `json:"-"`
	// Complete, if set (templates), suggests values for a variable.
	Complete func(argument, value string, context map[string]string) []string `json:"-"`
}

// ResourceContents is one item of an MCP ReadResourceResult: set Text, or
// Blob (base64 is done by JSON) for binary data.
type ResourceContents struct {
	URI      string `json:"uri"`
	MIMEType string `json:"mimeType,omitempty"`
	Text     string `json:"text,omitempty"`
	Blob     []byte `json:"blob,omitempty"`
}

var (
	prompts   = map[string]Prompt{}
	resources = map[string]Resource{}
	templates []Resource
)

// RegisterPrompt adds prompts. Call it from init.
func RegisterPrompt(ps ...Prompt) {
	for _, p := range ps {
		prompts[p.Name] = p
	}
}

// RegisterResource adds resources and resource templates. Call it from
// init.
func RegisterResource(rs ...Resource) {
	for _, r := range rs {
		if r.URITemplate != "" {
			templates = append(templates, r)
		} else {
			resources[r.URI] = r
		}
	}
}

//go:wasmexport list_prompts
func listPrompts() int32 {
	out := abi.ListPromptsResult{Prompts: []json.RawMessage{}}
	for _, n := range slices.Sorted(maps.Keys(prompts)) {
		b, _ := json.Marshal(prompts[n])
		out.Prompts = append(out.Prompts, b)
	}
	return writeJSON(out)
}

//go:wasmexport get_prompt
func getPrompt() int32 {
	var in struct {
		Request struct {
			Name      string            `json:"name"`
			Arguments map[string]string `json:"arguments"`
		} `json:"request"`
	}
	if err := json.Unmarshal(Input(), &in); err != nil {
		return fail(err)
	}
	p, ok := prompts[in.Request.Name]
	if !ok || p.Get == nil {
		return fail(fmt.Errorf("unknown prompt %q", in.Request.Name))
	}
	for _, a := range p.Arguments {
		if _, given := in.Request.Arguments[a.Name]; a.Required && !given {
			return fail(fmt.Errorf("prompt %q needs argument %q", p.Name, a.Name))
		}
	}
	res, err := p.Get(in.Request.Arguments)
	if err != nil {
		return fail(err)
	}
	return writeJSON(res)
}

//go:wasmexport list_resources
func listResources() int32 {
	out := abi.ListResourcesResult{Resources: []json.RawMessage{}}
	for _, u := range slices.Sorted(maps.Keys(resources)) {
		b, _ := json.Marshal(resources[u])
		out.Resources = append(out.Resources, b)
	}
	return writeJSON(out)
}

//go:wasmexport list_resource_templates
func listResourceTemplates() int32 {
	out := abi.ListResourceTemplatesResult{ResourceTemplates: []json.RawMessage{}}
	for _, t := range templates {
		b, _ := json.Marshal(t)
		out.ResourceTemplates = append(out.ResourceTemplates, b)
	}
	return writeJSON(out)
}

// match reports whether uri fits template (simple {var} expansion, each
// variable matching up to the next "/"), and its variables.
func match(template, uri string) (map[string]string, bool) {
	var b strings.Builder
	var names []string
	for rest := template; rest != ""; {
		lit, after, ok := strings.Cut(rest, "{")
		b.WriteString(regexp.QuoteMeta(lit))
		if !ok {
			break
		}
		name, after, ok := strings.Cut(after, "}")
		if !ok {
			return nil, false
		}
		names = append(names, name)
		b.WriteString(`([^/]+)`)
		rest = after
	}
	re, err := regexp.Compile("^" + b.String() + "$")
	if err != nil {
		return nil, false
	}
	m := re.FindStringSubmatch(uri)
	if m == nil {
		return nil, false
	}
	vars := map[string]string{}
	for i, n := range names {
		vars[n] = m[i+1]
	}
	return vars, true
}

//go:wasmexport read_resource
func readResource() int32 {
	var in struct {
		Request struct {
			URI string `json:"uri"`
		} `json:"request"`
	}
	if err := json.Unmarshal(Input(), &in); err != nil {
		return fail(err)
	}
	uri := in.Request.URI
	r, ok := resources[uri]
	vars := map[string]string{}
	if !ok {
		for _, t := range templates {
			if v, matched := match(t.URITemplate, uri); matched {
				r, vars, ok = t, v, true
				break
			}
		}
	}
	if !ok || r.Read == nil {
		return fail(fmt.Errorf("no resource %q", uri))
	}
	contents, err := r.Read(uri, vars)
	if err != nil {
		return fail(err)
	}
	return writeJSON(map[string]any{"contents": contents})
}

//go:wasmexport complete
func complete() int32 {
	var in struct {
		Request struct {
			Ref struct {
				Type, Name, URI string
			} `json:"ref"`
			Argument struct {
				Name, Value string
			} `json:"argument"`
			Context *struct {
				Arguments map[string]string `json:"arguments"`
			} `json:"context"`
		} `json:"request"`
	}
	if err := json.Unmarshal(Input(), &in); err != nil {
		return fail(err)
	}
	var fn func(string, string, map[string]string) []string
	// The host sends hyper-mcp's "prompt" and "resource"; MCP's
	// "ref/prompt" and "ref/resource" are accepted too.
	switch strings.TrimPrefix(in.Request.Ref.Type, "ref/") {
	case "prompt":
		fn = prompts[in.Request.Ref.Name].Complete
	case "resource":
		for _, t := range templates {
			if t.URITemplate == in.Request.Ref.URI {
				fn = t.Complete
			}
		}
	}
	values := []string{}
	if fn != nil {
		var ctx map[string]string
		if in.Request.Context != nil {
			ctx = in.Request.Context.Arguments
		}
		values = fn(in.Request.Argument.Name, in.Request.Argument.Value, ctx)
	}
	return writeJSON(map[string]any{"completion": map[string]any{"values": values, "total": len(values), "hasMore": false}})
}

// NotifyResourceUpdated tells subscribed clients that the resource at uri
// changed.
func NotifyResourceUpdated(uri string) {
	hostNotifyResourceUpdated(storeJSON(map[string]string{"uri": uri}))
}

//go:wasmimport extism:host/user notify_resource_updated
func hostNotifyResourceUpdated(offset uint64)
