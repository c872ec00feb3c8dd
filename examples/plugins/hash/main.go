//go:build wasip1

// Command hash is a stateless example plugin: digests and encodings of
// text. It is built with the standard Go toolchain and the wasmtools guest
// library, and speaks the v2 plugin interface.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o hash.wasm .
package main

import (
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash"

	"github.com/wasmtools/wasmtools/abi/guest"
)

func main() {}

func init() {
	guest.Register(
		guest.Tool{
			Name:        "hash",
			Description: "Returns the hex digest of a text under a hash algorithm (sha256 unless told).",
			InputSchema: `{"type":"object","properties":{
				"text":{"type":"string","description":"The text to hash, as UTF-8."},
				"algorithm":{"type":"string","enum":["md5","sha1","sha256","sha512"],"default":"sha256"}},
				"required":["text"],"additionalProperties":false}`,
			Annotations: `{"readOnlyHint":true,"idempotentHint":true,"openWorldHint":false}`,
			Handler:     digest,
		},
		guest.Tool{
			Name:        "base64",
			Description: "Encodes a text as standard base64, or decodes base64 back to text.",
			InputSchema: `{"type":"object","properties":{
				"text":{"type":"string"},
				"decode":{"type":"boolean","default":false}},
				"required":["text"],"additionalProperties":false}`,
			Annotations: `{"readOnlyHint":true,"idempotentHint":true,"openWorldHint":false}`,
			Handler:     encode,
		},
	)
}

func digest(c *guest.Call) (*guest.Result, error) {
	var in struct {
		Text      string `json:"text"`
		Algorithm string `json:"algorithm"`
	}
	if err := c.Bind(&in); err != nil {
		return nil, err
	}
	var h hash.Hash
	switch in.Algorithm {
	case "", "sha256":
		h = sha256.New()
	case "sha512":
		h = sha512.New()
	case "sha1":
		h = sha1.New()
	case "md5":
		h = md5.New()
	default:
		return nil, fmt.Errorf("unknown algorithm %q: use md5, sha1, sha256 or sha512", in.Algorithm)
	}
	h.Write([]byte(in.Text))
	return guest.Text(hex.EncodeToString(h.Sum(nil))), nil
}

func encode(c *guest.Call) (*guest.Result, error) {
	var in struct {
		Text   string `json:"text"`
		Decode bool   `json:"decode"`
	}
	if err := c.Bind(&in); err != nil {
		return nil, err
	}
	if !in.Decode {
		return guest.Text(base64.StdEncoding.EncodeToString([]byte(in.Text))), nil
	}
	b, err := base64.StdEncoding.DecodeString(in.Text)
	if err != nil {
		return nil, fmt.Errorf("not base64: %v", err)
	}
	return guest.Text(string(b)), nil
}
