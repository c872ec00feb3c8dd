package main

import (
	"bytes"
	"runtime/debug"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

func TestVersionOf(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "0123456789abcdef0123456789abcdef01234567"
	tests := []struct {
		name string
		info *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "devel"},
		{"no version, no vcs", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
		{"empty version", &debug.BuildInfo{}, "devel"},
		{"module version", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}, Settings: vcs(rev, "true")}, "v1.2.3"},
		{"pseudo-version", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261130140000-0123456789ab"}}, "v0.0.0-20261130140000-0123456789ab"},
		{"clean revision", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "false")}, "0123456789ab"},
		{"dirty revision", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "true")}, "0123456789ab-dirty"},
		{"short revision", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("abc", "false")}, "abc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := versionOf(tt.info); got != tt.want {
				t.Errorf("versionOf = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	if version() == "" {
		t.Fatal("version() is empty")
	}
	for _, arg := range []string{"version", "--version"} {
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), []string{arg}, nil, nil, &stdout, &stderr); code != 0 {
			t.Fatalf("wasmtools %s: exit %d, stderr %q", arg, code, stderr.String())
		}
		if got, want := stdout.String(), version()+"\n"; got != want {
			t.Errorf("wasmtools %s printed %q, want %q", arg, got, want)
		}
	}
}

// TestServerReportsVersion checks that a served client sees the same
// version as `wasmtools version`, not the host's default.
func TestServerReportsVersion(t *testing.T) {
	var stderr lockedBuffer
	cs := connectStdio(t, &stderr, testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")}))
	got := cs.InitializeResult().ServerInfo
	if got.Name != "wasmtools" || got.Version != version() {
		t.Errorf("server reports %s %s, want wasmtools %s", got.Name, got.Version, version())
	}
}
