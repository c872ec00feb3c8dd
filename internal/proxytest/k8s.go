package proxytest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"
)

// Manifests decodes every YAML document of the files dir/*.yaml (such
// as deploy/k8s), keyed "Kind/name". A folder with no manifests, a file
// that does not read or decode, or a document that lacks apiVersion,
// kind or metadata.name fails the test: a check of what is not there
// would pass.
func Manifests(t testing.TB, dir string) map[string]Obj {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", dir)
	}
	objs := map[string]Obj{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(src))
		for i := 0; ; i++ {
			var doc map[string]any
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: document %d: %v", f, i, err)
			}
			o := Obj(doc)
			kind, name := o.Str("kind"), o.Str("metadata", "name")
			if o.Str("apiVersion") == "" || kind == "" || name == "" {
				t.Fatalf("%s: document %d lacks apiVersion, kind or metadata.name", f, i)
			}
			objs[kind+"/"+name] = o
		}
	}
	return objs
}

// Obj is a decoded YAML mapping. Its getters take a path of keys and
// give the zero value where the path leads nowhere or to another type,
// so a check reads a missing field as empty rather than panicking.
type Obj map[string]any

// Get is the value at path, nil if there is none.
func (o Obj) Get(path ...string) any {
	var v any = map[string]any(o)
	for _, k := range path {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

// Str is the string at path, "" if there is none.
func (o Obj) Str(path ...string) string { s, _ := o.Get(path...).(string); return s }

// Sub is the mapping at path, nil if there is none.
func (o Obj) Sub(path ...string) Obj { m, _ := o.Get(path...).(map[string]any); return m }

// List is the list at path, each element a mapping (or, for scalars,
// a mapping of "" to the value: see Scalar).
func (o Obj) List(path ...string) []Obj {
	l, _ := o.Get(path...).([]any)
	var out []Obj
	for _, e := range l {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m)
		} else {
			out = append(out, Obj{"": e})
		}
	}
	return out
}

// First is the first element of the list at path, nil if it is empty.
func (o Obj) First(path ...string) Obj {
	if l := o.List(path...); len(l) > 0 {
		return l[0]
	}
	return nil
}

// Scalar is the value of a list element that is not a mapping.
func (o Obj) Scalar() string { return fmt.Sprint(o[""]) }
