package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/term"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/grantstore"
	"github.com/wasmtools/wasmtools/plugins"
)

// answers are the --answer flags: the answers to the tool's questions, in
// the order it asks them.
type answers []string

func (a *answers) String() string     { return strings.Join(*a, " ") }
func (a *answers) Set(v string) error { *a = append(*a, v); return nil }

func cmdCall(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var common commonFlags
	common.register(fs)
	var given answers
	fs.Var(&given, "answer", "answer the tool's next question with this JSON: an elicitation result ({\"action\":\"accept\",\"content\":{...}}) or the content object alone (accepted); repeat for several questions. Without it, questions are asked on the terminal")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: wasmtools call [flags] FILE.wasm TOOL [ARGUMENTS_JSON]

Calls one tool of a plugin once, in a fresh instance with the same sandbox
and host functions as `+"`serve`"+`, and prints the result as JSON on stdout.
The arguments are checked against the tool's input schema first. Progress,
log messages and records go to stderr; a question the tool asks is asked on
the terminal (or answered with --answer); the tool sees the current folder
as its one root. Exits 1 if the result is an error.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return flagsExit(err)
	}
	if fs.NArg() < 2 || fs.NArg() > 3 {
		fs.Usage()
		return 2
	}
	path, toolName := fs.Arg(0), fs.Arg(1)
	argsJSON := json.RawMessage(`{}`)
	if fs.NArg() == 3 {
		argsJSON = json.RawMessage(fs.Arg(2))
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "wasmtools call: %v\n", err)
		return 1
	}
	var arguments map[string]any
	if err := json.Unmarshal(argsJSON, &arguments); err != nil {
		return fail(fmt.Errorf("arguments: want a JSON object: %v", err))
	}
	// The host's own log is for the operator of a server (it repeats the
	// guest's log messages, which are printed below): here only its
	// errors, and everything with -v.
	level := slog.LevelError
	if common.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := common.loadConfig(lookupEnv); err != nil {
		return fail(err)
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		return fail(err)
	}
	rt, err := common.runtime(log)
	if err != nil {
		return fail(err)
	}
	defer rt.Close(context.Background())
	p, err := plugins.Load(ctx, rt, path, wasm, common.optsFor(log)(path))
	if err != nil {
		return fail(err)
	}
	// Grants are keyed by the plugin's name, its file's: under any other
	// name they reach nothing, and the call would fail for want of them
	// with no word of why (a Go guest's file access says only "Bad file
	// number").
	if named := common.config().Plugins; len(named) > 0 {
		if _, ok := named[p.Name()]; !ok {
			var sections []string
			for _, n := range slices.Sorted(maps.Keys(named)) {
				sections = append(sections, "[plugins."+n+"]")
			}
			fmt.Fprintf(stderr, "wasmtools call: warning: the configuration has no [plugins.%s], so none of its plugin settings apply: it has %s, and the plugin is named %q after its file\n", p.Name(), strings.Join(sections, ", "), p.Name())
		}
	}
	cat, _ := plugins.NewCatalogue([]*plugins.Plugin{p}) // one plugin: no clash
	src := plugins.NewStatic(cat)
	defer src.Close(context.Background())
	var names []string
	for _, t := range p.Tools() {
		names = append(names, t.Name)
	}
	if !slices.Contains(names, toolName) {
		return fail(fmt.Errorf("plugin %q has no tool %q; it has %v", p.Name(), toolName, names))
	}

	// The call goes through the host, as from any MCP client, so that it
	// gets the host functions of `serve`; this command is the client.
	hopts := &host.Options{Logger: log, MaxGrantQuestions: common.config().Grants.MaxQuestions}
	if path := common.config().Grants.RememberFile; path != "" {
		if hopts.GrantFile, err = grantstore.Open(path); err != nil {
			return fail(err)
		}
	}
	h := host.New(src, hopts)
	defer h.Close(context.Background())
	st, ct := mcp.NewInMemoryTransports()
	if _, err := h.Server().Connect(ctx, st, nil); err != nil {
		return fail(err)
	}
	asker := &terminalAsker{in: bufio.NewReader(stdin), out: stderr, given: given, terminal: isTerminal(stdin)}
	client := mcp.NewClient(&mcp.Implementation{Name: "wasmtools-call", Version: version()}, &mcp.ClientOptions{
		ElicitationHandler: asker.elicit,
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			fmt.Fprintf(stderr, "progress: %s\n", progressLine(r.Params))
		},
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			b, _ := json.Marshal(r.Params.Data)
			fmt.Fprintf(stderr, "log %s: %s\n", r.Params.Level, b)
		},
	})
	if wd, err := os.Getwd(); err == nil {
		client.AddRoots(&mcp.Root{URI: (&url.URL{Scheme: "file", Path: filepath.ToSlash(wd)}).String(), Name: filepath.Base(wd)})
	}
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		return fail(err)
	}
	defer cs.Close()
	logLevel := mcp.LoggingLevel("info")
	if common.verbose {
		logLevel = "debug"
	}
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: logLevel}); err != nil {
		return fail(err)
	}
	// Protocol 2026-07-28 sets the log level per request.
	params := &mcp.CallToolParams{Name: toolName, Arguments: arguments, Meta: mcp.Meta{mcp.MetaKeyLogLevel: logLevel}}
	params.SetProgressToken("call")
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		return fail(err)
	}
	if asker.err != nil {
		return fail(asker.err)
	}
	printRecords(stderr, res.Meta[host.MetaRecords])
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(res); err != nil {
		return fail(err)
	}
	if res.IsError {
		// The reason on stderr too, for a person reading the terminal.
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				fmt.Fprintf(stderr, "wasmtools call: %s\n", t.Text)
			}
		}
		return 1
	}
	return 0
}

func progressLine(p *mcp.ProgressNotificationParams) string {
	s := strconv.FormatFloat(p.Progress, 'f', -1, 64)
	if p.Total > 0 {
		s += "/" + strconv.FormatFloat(p.Total, 'f', -1, 64)
	}
	if p.Message != "" {
		s += " " + plain(p.Message, false) // the plugin's, on the terminal of the questions
	}
	return s
}

func printRecords(w io.Writer, records any) {
	if records == nil {
		return
	}
	b, err := json.Marshal(records)
	if err != nil {
		return
	}
	var rs []struct {
		Namespace string          `json:"namespace"`
		Data      json.RawMessage `json:"data"`
	}
	if json.Unmarshal(b, &rs) != nil {
		return
	}
	for _, r := range rs {
		fmt.Fprintf(w, "record %s: %s\n", r.Namespace, r.Data)
	}
}

// isTerminal reports whether r is a terminal (not merely a character
// device such as /dev/null).
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// terminalAsker answers a tool's questions: with the --answer flags in
// order, then on the terminal. Without either, the question is cancelled
// and err says how to answer it.
type terminalAsker struct {
	in       *bufio.Reader
	out      io.Writer
	given    []string
	terminal bool
	err      error
}

func (a *terminalAsker) elicit(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	p := r.Params
	if len(a.given) > 0 {
		next := a.given[0]
		a.given = a.given[1:]
		return parseAnswer(next)
	}
	_, grant := p.Meta[host.MetaGrant]
	if !a.terminal {
		if grant {
			// The call goes on, refused the grant; the person is told
			// how they could approve it.
			a.err = fmt.Errorf("%s\nstdin is not a terminal, so no one could answer: run it in a terminal, or approve with --answer '{\"decision\":\"allow once\"}' (or \"allow for this session\"; \"deny\" refuses)", p.Message)
			return &mcp.ElicitResult{Action: "cancel"}, nil
		}
		a.err = fmt.Errorf("the tool asked %q, and stdin is not a terminal: answer with --answer JSON", p.Message)
		return &mcp.ElicitResult{Action: "cancel"}, nil
	}
	if grant {
		return a.grant(p.Message), nil
	}
	fmt.Fprintf(a.out, "\nThe tool asks:\n%s\n", plain(p.Message, true))
	if p.Mode == "url" {
		fmt.Fprintf(a.out, "Open %s\nDone? [y]es, [n]o (decline), [c]ancel: ", plain(p.URL, false))
		return &mcp.ElicitResult{Action: a.choice()}, nil
	}
	var schema struct {
		Properties map[string]struct {
			Type        string `json:"type"`
			Title       string `json:"title"`
			Description string `json:"description"`
			Enum        []any  `json:"enum"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if b, err := json.Marshal(p.RequestedSchema); err == nil {
		json.Unmarshal(b, &schema)
	}
	fmt.Fprint(a.out, "Answer? [y]es, [n]o (decline), [c]ancel: ")
	if action := a.choice(); action != "accept" {
		return &mcp.ElicitResult{Action: action}, nil
	}
	content := map[string]any{}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range schema.Properties {
			if !yield(k) {
				return
			}
		}
	}) {
		prop := schema.Properties[name]
		label := name
		if prop.Description != "" {
			label += " (" + prop.Description + ")"
		}
		if len(prop.Enum) > 0 {
			label += fmt.Sprintf(" one of %v", prop.Enum)
		}
		for {
			fmt.Fprintf(a.out, "%s [%s]: ", plain(label, false), plain(prop.Type, false))
			line, err := a.in.ReadString('\n')
			line = strings.TrimSpace(line)
			if line == "" && (err != nil || !slices.Contains(schema.Required, name)) {
				break
			}
			v, perr := parseValue(prop.Type, line)
			if perr == nil {
				content[name] = v
				break
			}
			fmt.Fprintf(a.out, "  %v\n", perr)
			if err != nil {
				break
			}
		}
	}
	return &mcp.ElicitResult{Action: "accept", Content: content}, nil
}

// plain is a plugin's text as the terminal shows it: control and format
// characters dropped (escape sequences, which can hide what follows, such
// as the host's next grant question, or make a link open elsewhere;
// carriage returns; reordering characters), tabs made spaces, and with
// lines each line quoted ("  > "), else newlines made spaces, so that no
// line of the plugin's passes for the host's ("wasmtools asks you: ...").
func plain(s string, lines bool) string {
	var b strings.Builder
	for _, c := range s {
		switch {
		case c == '\n' && lines:
		case c == '\n' || c == '\t':
			c = ' '
		case unicode.IsControl(c) || unicode.Is(unicode.Cf, c):
			continue
		}
		b.WriteRune(c)
	}
	if !lines {
		return b.String()
	}
	return "  > " + strings.ReplaceAll(b.String(), "\n", "\n  > ")
}

// grant asks the person on the terminal for a grant the host's question
// (message) describes: allow once, for this session, or deny.
func (a *terminalAsker) grant(message string) *mcp.ElicitResult {
	fmt.Fprintf(a.out, "\nwasmtools asks you: %s\n", message)
	choices := []string{"allow once", "allow for this session", "deny"}
	for {
		fmt.Fprint(a.out, "[1] allow once, [2] allow for this session, [3] deny, [c]ancel: ")
		line, err := a.in.ReadString('\n')
		switch s := strings.ToLower(strings.TrimSpace(line)); {
		case s == "1" || s == "2" || s == "3":
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": choices[s[0]-'1']}}
		case slices.Contains(choices, s):
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": s}}
		case s == "c" || s == "cancel" || err != nil:
			return &mcp.ElicitResult{Action: "cancel"}
		}
	}
}

// choice reads y, n or c: accept, decline or cancel (end of input).
func (a *terminalAsker) choice() string {
	line, _ := a.in.ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "", "y", "yes":
		return "accept"
	case "n", "no":
		return "decline"
	}
	return "cancel"
}

func parseValue(typ, s string) (any, error) {
	switch typ {
	case "number":
		return strconv.ParseFloat(s, 64)
	case "integer":
		return strconv.ParseInt(s, 10, 64)
	case "boolean":
		return strconv.ParseBool(s)
	}
	return s, nil
}

// parseAnswer reads an --answer: an elicitation result, or the content
// of an accepted one.
func parseAnswer(s string) (*mcp.ElicitResult, error) {
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("--answer %s: want a JSON object: %v", s, err)
	}
	if action, ok := m["action"].(string); ok {
		content, _ := m["content"].(map[string]any)
		return &mcp.ElicitResult{Action: action, Content: content}, nil
	}
	return &mcp.ElicitResult{Action: "accept", Content: m}, nil
}
