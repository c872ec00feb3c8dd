package plugins

import (
	"encoding/json"
	"unicode/utf8"
)

// flatSchema is the common shape of an input schema that a call's
// arguments can be checked against without decoding them: an object whose
// declared properties are strings or booleans, some of them required,
// maybe closed (additionalProperties false), with no other keyword but
// annotations. Its check proves arguments valid or gives up, never
// refuses: arguments it does not prove valid go through the full
// validator, so every error is the validator's own. nil for any other
// schema.
type flatSchema struct {
	props    map[string]flatProp
	required uint64 // the bits of the required properties
	closed   bool
}

// flatProp is one property of a flatSchema: its type ('s' string, 'b'
// boolean, 0 for a required name the properties do not declare) and, if
// required, its bit.
type flatProp struct {
	typ byte
	bit uint64
}

// flatSchemaOf returns the flatSchema of tree, a schema as the validator
// reads it (canonical JSON decoded into any), or nil.
func flatSchemaOf(tree any) *flatSchema {
	root, ok := tree.(map[string]any)
	if !ok || root["type"] != "object" {
		return nil
	}
	f := &flatSchema{props: map[string]flatProp{}}
	for k, v := range root {
		switch k {
		case "type", "title", "description":
		case "properties":
			props, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			for name, p := range props {
				typ := flatType(p)
				if typ == 0 {
					return nil
				}
				f.props[name] = flatProp{typ: typ}
			}
		case "required":
		case "additionalProperties":
			if v != false {
				return nil
			}
			f.closed = true
		default:
			return nil
		}
	}
	req, _ := root["required"].([]any)
	if _, ok := root["required"]; ok && req == nil || len(req) > 64 {
		return nil
	}
	for i, r := range req {
		name, ok := r.(string)
		if !ok {
			return nil
		}
		p := f.props[name]
		p.bit |= 1 << i
		f.props[name] = p
		f.required |= 1 << i
	}
	return f
}

// flatType is the type of a property schema with only a type of string or
// boolean and annotations, or 0.
func flatType(p any) byte {
	m, ok := p.(map[string]any)
	if !ok {
		return 0
	}
	var typ byte
	for k, v := range m {
		switch k {
		case "title", "description":
		case "type":
			switch v {
			case "string":
				typ = 's'
			case "boolean":
				typ = 'b'
			default:
				return 0
			}
		default:
			return 0
		}
	}
	return typ
}

// valid reports whether b, arguments within the limits of
// checkArguments, is surely a JSON object valid against f: every member a
// string or boolean, of its property's type, none undeclared if f is
// closed, every required one present. False means only "not proved": a
// number, null, array or object member, or a key with an escape or not
// UTF-8, is left to the full validator.
func (f *flatSchema) valid(b []byte) bool {
	if !json.Valid(b) {
		return false
	}
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	var seen uint64
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return f.required == 0
	}
	for i < len(b) {
		// A key: valid JSON, so a string.
		start := i + 1
		end := start
		for b[end] != '"' {
			if b[end] == '\\' {
				return false
			}
			end++
		}
		key := b[start:end]
		if !utf8.Valid(key) { // decoded, it would name another property
			return false
		}
		p, declared := f.props[string(key)]
		if f.closed && (!declared || p.typ == 0) {
			return false
		}
		i = skipSpace(b, end+1) + 1 // past ':'
		i = skipSpace(b, i)
		var typ byte
		switch b[i] {
		case '"':
			typ = 's'
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			i++
		case 't':
			typ, i = 'b', i+4
		case 'f':
			typ, i = 'b', i+5
		default:
			return false
		}
		if declared && p.typ != 0 && p.typ != typ {
			return false
		}
		seen |= p.bit
		i = skipSpace(b, i)
		if b[i] == '}' {
			break
		}
		i = skipSpace(b, i+1) // past ','
	}
	return seen&f.required == f.required
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
