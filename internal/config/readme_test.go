package config_test

import (
	"os"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/config"
)

// TestREADMEConfigParses: the README's sample configuration, which users
// copy, is one the server accepts (it once put [http] settings under
// [http.oauth], refused as unknown).
func TestREADMEConfigParses(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The configuration section's block, at the start of a line (an
	// indented one earlier is a fragment).
	_, rest, ok := strings.Cut(string(b), "### Configuration (`--config FILE`, TOML)\n\n```toml\n")
	if !ok {
		t.Fatal("no toml block in the README")
	}
	sample, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("the README's toml block does not end")
	}
	// The pin's placeholder stands for a real digest.
	sample = strings.Replace(sample, `"9f2c…"`, `"`+strings.Repeat("9f2c", 16)+`"`, 1)
	env := func(name string) (string, bool) { return "value-of-" + strings.ToLower(name) + "-0123456789", true }
	if _, err := config.Parse([]byte(sample), env); err != nil {
		t.Errorf("the README's sample configuration is refused: %v", err)
	}
}
