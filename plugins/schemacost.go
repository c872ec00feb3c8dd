package plugins

import (
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"sort"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
)

// Bounds on the cost of validating tool arguments (issue 12). jsonschema-go
// validates a value once for each way the schema reaches it: every branch
// of allOf, anyOf and oneOf (all visited, to collect annotations), not,
// if/then/else, dependentSchemas and $ref applies to the same value, and
// properties, patternProperties, additionalProperties, items, contains and
// the like to its children. A $ref cycle through two branches that both
// descend into the same child doubles the work at each level of the
// argument, and a chain of combinators doubles it at each link, so a
// 100-byte argument or a 1 KiB schema could hold the host for hours; a Go
// validator cannot be interrupted. So the cost is bounded at load:
// [checkCost] counts, for every argument value up to [MaxArgumentDepth]
// deep, how many schema applications reach it, and refuses the schema if
// any value would get more than [maxApplications]. Before validation, an
// argument is refused over [MaxArgumentBytes], nested deeper than
// [MaxArgumentDepth], or when its values (each counted as deep as it is,
// plus one per 64 bytes of a string) times the schema's worst count per
// value exceed [maxCallApplications]. This is not a deadline: validation
// still runs to its end, but that end is about a second away at most.
const (
	// MaxArgumentBytes bounds the tool arguments the host validates: 4 MiB,
	// as the HTTP transport's default body limit.
	MaxArgumentBytes = 4 << 20
	// MaxArgumentDepth bounds how deeply tool arguments may nest arrays
	// and objects (the arguments object itself is depth 1). Tool arguments
	// are shallow; the bound makes the load-time cost analysis exact.
	MaxArgumentDepth = 64
	// maxApplications bounds the schema applications to one argument
	// value, weighted: an enum of n values counts 1 + n/16, a pattern of
	// n instructions 1 + n/32.
	maxApplications = 4096
	// maxSchemaNodes bounds the subschemas of one input schema, and
	// maxCostStates the sets of subschemas the analysis tracks, and
	// maxCostWork its steps, so that the analysis itself is bounded (well
	// under a second).
	maxSchemaNodes = 10000
	maxCostStates  = 100000
	maxCostWork    = 1 << 24
	// maxCallApplications bounds the work of validating one call's
	// arguments: the sum of their values' depths times the schema's worst
	// count per value. A value counts as many times as it is deep because
	// a check that fails prints the value (its whole subtree) and every
	// level above wraps the message: on a schema like anyOf of the JSON
	// types, 130 000 values nested 62 deep took 12 s, and 2 s flat. About
	// a second of validation on a loaded machine.
	maxCallApplications = 1 << 20
)

var errTooComplex = errors.New("validation cost: the schema is too complex to analyse")

// inputSchema is a tool's compiled input schema and its worst weighted
// count of applications per argument value, from [checkCost], with what
// makes the common calls cheap to validate.
type inputSchema struct {
	*jsonschema.Resolved
	perValue sat
	// emptyErr is the verdict on no arguments (an empty object), the
	// same on every call, so found once.
	emptyErr error
	// flat, if not nil, proves the common arguments valid without
	// decoding them.
	flat *flatSchema
}

// sat is a saturating count.
type sat uint64

const satMax = sat(1) << 50

func (a sat) add(b sat) sat { return min(a+b, satMax) }
func (a sat) mul(b sat) sat {
	if a == 0 || b == 0 {
		return 0
	}
	if a > satMax/b {
		return satMax
	}
	return a * b
}

// costNode is one subschema, as the validator reads it.
type costNode struct {
	path    string // JSON pointer, "" for the root
	weight  sat
	inPlace []int // applied to the same value
	// applied to children
	props     map[string]int
	patterns  []costPattern
	additionl []int // additionalProperties
	anyKey    []int // unevaluatedProperties
	names     []int // propertyNames
	index     map[int]int
	anyIndex  []int // items, additionalItems, contains, unevaluatedItems
	closure   map[int]sat
}

type costPattern struct {
	re   *regexp.Regexp
	node int
}

type costGraph struct {
	work  int // steps of the analysis so far
	root  any
	nodes []*costNode
	ids   map[string]int
}

// checkCost refuses a schema (the canonical tree, references already
// checked by checkRefs) that could apply more than maxApplications
// subschemas to one argument value no deeper than MaxArgumentDepth. The
// error names the argument path, the subschema applied most often there,
// and the count. It returns the largest weighted count over all values.
func checkCost(root any) (sat, error) {
	worstTotal := sat(0)
	err := func() error {
		g := &costGraph{root: root, ids: map[string]int{}}
		r, err := g.node("")
		if err != nil {
			return err
		}
		for id := range g.nodes {
			if err := g.close(id, 0); err != nil {
				return err
			}
		}
		// Every key and index the schema names is a class of its own; any
		// other key, any other index and a property name are three more.
		keys, maxIndex := map[string]bool{}, 0
		for i := 0; i < len(g.nodes); i++ {
			for k := range g.nodes[i].props {
				keys[k] = true
			}
			for ix := range g.nodes[i].index {
				maxIndex = max(maxIndex, ix+1)
			}
		}
		type class struct {
			key   string
			index int // -1: a key; -2: another index; -3: a property name
			other bool
		}
		var classes []class
		for k := range keys {
			classes = append(classes, class{key: k, index: -1})
		}
		sort.Slice(classes, func(i, j int) bool { return classes[i].key < classes[j].key })
		classes = append(classes, class{index: -1, other: true})
		for i := range maxIndex {
			classes = append(classes, class{index: i})
		}
		classes = append(classes, class{index: -2}, class{index: -3})

		children := func(n *costNode, c class) []int {
			var out []int
			switch {
			case c.index == -3:
				return n.names
			case c.index == -1:
				matched := false
				if !c.other {
					if id, ok := n.props[c.key]; ok {
						out = append(out, id)
						matched = true
					}
				}
				for _, p := range n.patterns {
					if c.other || p.re.MatchString(c.key) {
						out = append(out, p.node)
						matched = true
					}
				}
				if c.other || !matched {
					out = append(out, n.additionl...)
				}
				return append(out, n.anyKey...)
			default:
				if id, ok := n.index[c.index]; ok && c.index >= 0 {
					out = append(out, id)
				}
				return append(out, n.anyIndex...)
			}
		}

		type state struct {
			counts map[int]sat
			path   []string
		}
		weigh := func(counts map[int]sat) (sat, int) {
			var total, most sat
			worst := -1
			for id, c := range counts {
				w := c.mul(g.nodes[id].weight)
				total = total.add(w)
				if w > most || w == most && worst >= 0 && g.nodes[id].path < g.nodes[worst].path {
					most, worst = w, id
				}
			}
			return total, worst
		}
		support := func(counts map[int]sat) string {
			ids := make([]int, 0, len(counts))
			for id := range counts {
				ids = append(ids, id)
			}
			sort.Ints(ids)
			var b strings.Builder
			for _, id := range ids {
				b.WriteString(strconv.Itoa(id))
				b.WriteByte(',')
			}
			return b.String()
		}
		refuse := func(s state, total sat, worst int) error {
			where := "/" + strings.Join(s.path, "/")
			n := "more than " + strconv.FormatUint(uint64(satMax), 10)
			if total < satMax {
				n = strconv.FormatUint(uint64(total), 10)
			}
			return fmt.Errorf("validation could blow up: an argument value at %s (depth %d) would be checked against %s subschemas (limit %d), most often #%s (%d times): a $ref cycle or nesting of allOf/anyOf/oneOf/not applies the same subschemas more than once to the same value",
				where, len(s.path)+1, n, maxApplications, g.nodes[worst].path, s.counts[worst])
		}

		level := []state{{counts: g.nodes[r].closure}}
		if total, worst := weigh(level[0].counts); total > maxApplications {
			return refuse(level[0], total, worst)
		} else {
			worstTotal = total
		}
		seen := 0
		prev := ""
		for depth := 1; depth < MaxArgumentDepth && len(level) > 0; depth++ {
			next := map[string]*state{}
			var order []string
			for _, s := range level {
				for _, c := range classes {
					if g.work += len(s.counts); g.work > maxCostWork {
						return errTooComplex
					}
					counts := map[int]sat{}
					for id, k := range s.counts {
						for _, ch := range children(g.nodes[id], c) {
							for t, m := range g.nodes[ch].closure {
								counts[t] = counts[t].add(k.mul(m))
							}
							if g.work += len(g.nodes[ch].closure); g.work > maxCostWork {
								return errTooComplex
							}
						}
					}
					if len(counts) == 0 {
						continue
					}
					label := c.key
					switch {
					case c.other:
						label = "*"
					case c.index == -2:
						label = "*"
					case c.index == -3:
						label = "(property name)"
					case c.index >= 0:
						label = strconv.Itoa(c.index)
					}
					ns := state{counts: counts, path: append(append([]string(nil), s.path...), label)}
					total, worst := weigh(counts)
					if total > maxApplications {
						return refuse(ns, total, worst)
					}
					worstTotal = max(worstTotal, total)
					// States with the same subschemas merge into their
					// largest counts: the bound stays an upper bound.
					key := support(counts)
					if old, ok := next[key]; ok {
						for t, m := range counts {
							old.counts[t] = max(old.counts[t], m)
						}
						continue
					}
					if seen++; seen > maxCostStates {
						return errTooComplex
					}
					next[key] = &ns
					order = append(order, key)
				}
			}
			sort.Strings(order)
			level = level[:0]
			var fp strings.Builder
			for _, k := range order {
				level = append(level, *next[k])
				fmt.Fprint(&fp, k, next[k].counts, ";")
			}
			// The same states as the level before: deeper levels repeat it.
			if fp.String() == prev {
				break
			}
			prev = fp.String()
		}
		return nil
	}()
	return worstTotal, err
}

// node returns the id of the subschema at JSON pointer path (references
// already resolve: checkRefs checked them), building it and those it
// applies.
func (g *costGraph) node(path string) (int, error) {
	if id, ok := g.ids[path]; ok {
		return id, nil
	}
	if len(g.nodes) >= maxSchemaNodes {
		return 0, fmt.Errorf("validation cost: more than %d subschemas", maxSchemaNodes)
	}
	v, err := pointer(g.root, path)
	if err != nil {
		return 0, err
	}
	id := len(g.nodes)
	n := &costNode{path: path, weight: 1, props: map[string]int{}, index: map[int]int{}}
	g.nodes = append(g.nodes, n)
	g.ids[path] = id
	m, _ := v.(map[string]any)
	if m == nil { // true or false
		return id, nil
	}
	if _, ok := m["$id"]; ok && path != "" {
		// The validator resolves "#…" below an $id against it, not the
		// root that checkRefs resolved against.
		return 0, fmt.Errorf("#%s: $id is only allowed at the root", path)
	}
	if enum, ok := m["enum"].([]any); ok {
		n.weight += sat(len(enum) / 16)
	}
	// A pattern costs up to its program's size per byte matched (Go's
	// regexp is linear in the text, but each byte may step every
	// instruction); patternProperties match every key of the value.
	if p, ok := m["pattern"].(string); ok {
		n.weight += sat(regexpInsts(p) / 32)
	}
	if pp, ok := m["patternProperties"].(map[string]any); ok {
		for p := range pp {
			n.weight += sat(regexpInsts(p) / 32)
		}
	}
	sub := func(key string) (int, error) { return g.node(path + "/" + escapePointer(key)) }
	list := func(key string) ([]int, error) {
		var ids []int
		arr, _ := m[key].([]any)
		for i := range arr {
			c, err := g.node(path + "/" + escapePointer(key) + "/" + strconv.Itoa(i))
			if err != nil {
				return nil, err
			}
			ids = append(ids, c)
		}
		return ids, nil
	}
	one := func(key string, to *[]int) error {
		if _, ok := m[key]; !ok {
			return nil
		}
		if _, ok := m[key].([]any); ok {
			return nil
		}
		c, err := sub(key)
		if err != nil {
			return err
		}
		*to = append(*to, c)
		return nil
	}
	each := func(key string, f func(k string, id int) error) error {
		mm, _ := m[key].(map[string]any)
		keys := make([]string, 0, len(mm))
		for k, s := range mm {
			if _, isList := s.([]any); !isList { // dependencies' string lists
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			c, err := g.node(path + "/" + escapePointer(key) + "/" + escapePointer(k))
			if err != nil {
				return err
			}
			if err := f(k, c); err != nil {
				return err
			}
		}
		return nil
	}
	if ref, ok := m["$ref"].(string); ok {
		target := strings.TrimPrefix(ref, "#")
		c, err := g.node(target)
		if err != nil {
			return 0, err
		}
		n.inPlace = append(n.inPlace, c)
	}
	for _, k := range []string{"allOf", "anyOf", "oneOf"} {
		ids, err := list(k)
		if err != nil {
			return 0, err
		}
		n.inPlace = append(n.inPlace, ids...)
	}
	for _, k := range []string{"not", "if", "then", "else"} {
		if err := one(k, &n.inPlace); err != nil {
			return 0, err
		}
	}
	for _, k := range []string{"dependentSchemas", "dependencies"} {
		if err := each(k, func(_ string, c int) error { n.inPlace = append(n.inPlace, c); return nil }); err != nil {
			return 0, err
		}
	}
	if err := each("properties", func(k string, c int) error { n.props[k] = c; return nil }); err != nil {
		return 0, err
	}
	if err := each("patternProperties", func(k string, c int) error {
		re, err := regexp.Compile(k)
		if err != nil {
			return fmt.Errorf("patternProperties %q: %v", k, err)
		}
		n.patterns = append(n.patterns, costPattern{re, c})
		return nil
	}); err != nil {
		return 0, err
	}
	for k, to := range map[string]*[]int{"additionalProperties": &n.additionl, "unevaluatedProperties": &n.anyKey, "propertyNames": &n.names,
		"additionalItems": &n.anyIndex, "contains": &n.anyIndex, "unevaluatedItems": &n.anyIndex, "items": &n.anyIndex} {
		if err := one(k, to); err != nil {
			return 0, err
		}
	}
	for _, k := range []string{"prefixItems", "items"} {
		ids, err := list(k)
		if err != nil {
			return 0, err
		}
		for i, c := range ids {
			if _, ok := n.index[i]; ok { // both: count both
				n.anyIndex = append(n.anyIndex, c)
				continue
			}
			n.index[i] = c
		}
	}
	return id, nil
}

// close computes the in-place closure of node id: how many times each
// subschema applies to the value id applies to. checkRefs refused
// in-place cycles; the depth bound is a second guard. Counts saturate.
func (g *costGraph) close(id, depth int) error {
	n := g.nodes[id]
	if n.closure != nil {
		return nil
	}
	if depth > len(g.nodes) {
		return fmt.Errorf("$ref %q leads back to itself without descending into the value", "#"+n.path)
	}
	cl := map[int]sat{id: 1}
	for _, c := range n.inPlace {
		if err := g.close(c, depth+1); err != nil {
			return err
		}
		for t, k := range g.nodes[c].closure {
			cl[t] = cl[t].add(k)
		}
		if g.work += len(g.nodes[c].closure); g.work > maxCostWork {
			return errTooComplex
		}
	}
	n.closure = cl
	return nil
}

// regexpInsts is the size of p's compiled program, 0 if it does not
// compile (jsonschema-go's Resolve refuses it then).
func regexpInsts(p string) int {
	re, err := syntax.Parse(p, syntax.Perl)
	if err != nil {
		return 0
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return 0
	}
	return len(prog.Inst)
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// pointer resolves JSON pointer path ("" or "/a/b") in root.
func pointer(root any, path string) (any, error) {
	node := root
	if path == "" {
		return node, nil
	}
	for _, part := range strings.Split(path[1:], "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		switch v := node.(type) {
		case map[string]any:
			var ok bool
			if node, ok = v[part]; !ok {
				return nil, fmt.Errorf("$ref %q does not resolve", "#"+path)
			}
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(v) {
				return nil, fmt.Errorf("$ref %q does not resolve", "#"+path)
			}
			node = v[i]
		default:
			return nil, fmt.Errorf("$ref %q does not resolve", "#"+path)
		}
	}
	return node, nil
}

// checkArguments refuses arguments, before they are decoded, that are
// over MaxArgumentBytes, nest arrays and objects deeper than
// MaxArgumentDepth, or have so many values, so deep or so long, that
// validating them against this schema could take more than
// maxCallApplications.
func (s *inputSchema) checkArguments(b []byte) error {
	if len(b) > MaxArgumentBytes {
		return fmt.Errorf("%d bytes, over the limit of %d", len(b), MaxArgumentBytes)
	}
	// Every value but the first of an array or object follows a comma;
	// values sums their depths (an upper bound: a key counts too), and
	// every 64 bytes of a string count as one more value: a check on a
	// string (pattern, length, enum) reads it whole.
	depth, values, inString, escaped, start := 0, sat(1), false, false, 0
	for i, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
				values += sat((i - start) / 64)
			}
		case c == '"':
			inString, start = true, i
		case c == ',':
			values += sat(max(depth, 1))
		case c == '[' || c == '{':
			if depth++; depth > MaxArgumentDepth {
				return fmt.Errorf("nested deeper than %d levels", MaxArgumentDepth)
			}
			values += sat(depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	if n := values.mul(max(s.perValue, 1)); n > maxCallApplications {
		return fmt.Errorf("too many values for this tool's schema: their depths add up to about %d, each value checked against up to %d subschemas: over the limit of %d for one call", values, s.perValue, maxCallApplications)
	}
	return nil
}
