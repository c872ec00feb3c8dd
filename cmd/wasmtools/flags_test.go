package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"slices"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

func TestParseFlagsAnywhere(t *testing.T) {
	for _, c := range []struct {
		args []string
		http string
		json bool
		pos  []string
	}{
		{[]string{"--http", "a", "dir"}, "a", false, []string{"dir"}},
		{[]string{"dir", "--http", "a"}, "a", false, []string{"dir"}},
		{[]string{"d1", "--json", "d2", "--http=a"}, "a", true, []string{"d1", "d2"}},
		{[]string{"d1", "--", "--http", "x"}, "", false, []string{"d1", "--http", "x"}},
		{[]string{"--json", "--", "--"}, "", true, []string{"--"}},
		{nil, "", false, nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		h := fs.String("http", "", "")
		j := fs.Bool("json", false, "")
		if err := parseFlags(fs, c.args); err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if *h != c.http || *j != c.json || !slices.Equal(fs.Args(), c.pos) && len(fs.Args())+len(c.pos) > 0 {
			t.Errorf("%q: http %q json %v positional %q; want %q %v %q", c.args, *h, *j, fs.Args(), c.http, c.json, c.pos)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := parseFlags(fs, []string{"dir", "--nosuch"}); err == nil {
		t.Error("an unknown flag after a path was taken")
	}
}

// TestFlagAfterFile: a user's `inspect FILE --json` (the README's order)
// prints JSON, not the usage.
func TestFlagAfterFile(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"inspect", testplugins.Example(t, "counter"), "--json"}, lookup(nil), nil, &out, &errb)
	var v map[string]any
	if code != 0 || json.Unmarshal(out.Bytes(), &v) != nil {
		t.Errorf("inspect FILE --json: exit %d\n%s%s", code, out.String(), errb.String())
	}
}
