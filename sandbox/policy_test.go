package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/sandbox"
)

func TestPolicyValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	def := sandbox.NewPolicy()
	tests := []struct {
		name string
		p    sandbox.Policy
		want string // a substring of the error; "" for valid
	}{
		{"default", def, ""},
		{"everything granted", def.WithMemoryLimit(1).WithCallTimeout(time.Nanosecond).WithMaxOutput(1).WithMaxKernelMemory(1).
			WithConfig(map[string]string{"k": ""}).WithEnv(map[string]string{"HOME": "/data", "EMPTY": ""}).
			WithNetwork(sandbox.Network{AllowedHosts: []string{"api.example.com", "*.example.org", "127.0.0.*", "::1", "[::1]:8080", "api.example.com:8443"}, Timeout: time.Second}).
			WithMounts(sandbox.Mount{HostPath: dir}, sandbox.Mount{HostPath: dir, GuestPath: "/data", ReadOnly: true}), ""},
		{"zero value", sandbox.Policy{}, "memory limit: must be positive"},
		{"no memory", def.WithMemoryLimit(0), "memory limit: must be positive"},
		{"zero timeout", def.WithCallTimeout(0), "call timeout 0s: must be positive"},
		{"negative timeout", def.WithCallTimeout(-time.Second), "call timeout -1s: must be positive"},
		{"no output", def.WithMaxOutput(0), "max output: must be positive"},
		{"no kernel memory", def.WithMaxKernelMemory(0), "max kernel memory: must be positive"},
		{"nil logger", def.WithLogger(nil), "logger: nil"},
		{"empty config key", def.WithConfig(map[string]string{"": "x"}), "config: empty key"},
		{"empty env name", def.WithEnv(map[string]string{"": "x"}), "env: empty variable name"},
		{"= in env name", def.WithEnv(map[string]string{"A=B": "x"}), `env "A=B": the name has "=" or NUL`},
		{"NUL in env name", def.WithEnv(map[string]string{"A\x00": "x"}), `the name has "=" or NUL`},
		{"NUL in env value", def.WithEnv(map[string]string{"A": "x\x00y"}), `env "A": the value has NUL`},
		{"empty host", def.WithNetwork(sandbox.Network{AllowedHosts: []string{""}}), `allowed host "": empty`},
		{"URL as host", def.WithNetwork(sandbox.Network{AllowedHosts: []string{"https://example.com/"}}), "not a URL"},
		{"a port that is not a number", def.WithNetwork(sandbox.Network{AllowedHosts: []string{"example.com:https"}}), "the port must be a number"},
		{"a URL, not a host", def.WithNetwork(sandbox.Network{AllowedHosts: []string{"https://example.com/"}}), "not a URL"},
		{"host with a space", def.WithNetwork(sandbox.Network{AllowedHosts: []string{"example .com"}}), "not a URL"},
		{"unclosed IPv6 bracket", def.WithNetwork(sandbox.Network{AllowedHosts: []string{"[::1"}}), "no ]"},
		{"negative max response", def.WithNetwork(sandbox.Network{MaxResponse: -1}), "max response -1: must not be negative"},
		{"negative network timeout", def.WithNetwork(sandbox.Network{Timeout: -time.Second}), "network: timeout -1s: must not be negative"},
		{"relative host path", def.WithMounts(sandbox.Mount{HostPath: "data", GuestPath: "/data"}), `mount "data": the host path must be absolute`},
		{"missing host path", def.WithMounts(sandbox.Mount{HostPath: filepath.Join(dir, "missing"), GuestPath: "/data"}), "no such file or directory"},
		{"host path is a file", def.WithMounts(sandbox.Mount{HostPath: file, GuestPath: "/data"}), "the host path is not a folder"},
		{"relative guest path", def.WithMounts(sandbox.Mount{HostPath: dir, GuestPath: "data"}), `guest path "data": must be a clean absolute path`},
		{"unclean guest path", def.WithMounts(sandbox.Mount{HostPath: dir, GuestPath: "/data/../etc"}), "must be a clean absolute path"},
		{"guest path twice", def.WithMounts(sandbox.Mount{HostPath: dir, GuestPath: "/data"}, sandbox.Mount{HostPath: dir, GuestPath: "/data"}), `guest path "/data" is mounted twice`},
		{"root twice", def.WithMounts(sandbox.Mount{HostPath: dir}, sandbox.Mount{HostPath: dir, GuestPath: "/"}), `guest path "/" is mounted twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate: %v, want an error containing %q", err, tt.want)
			case err != nil && !strings.HasPrefix(err.Error(), "policy: "):
				t.Errorf("Validate: %q does not start with \"policy: \"", err)
			}
		})
	}
}

// TestPolicyValidateReportsAll checks that every bad value is reported,
// not only the first.
func TestPolicyValidateReportsAll(t *testing.T) {
	err := sandbox.Policy{}.Validate()
	if err == nil {
		t.Fatal("the zero Policy is valid")
	}
	for _, want := range []string{"memory limit", "call timeout", "max output", "max kernel memory", "logger"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v: no %q", err, want)
		}
	}
}

// TestCompileValidatesPolicyFirst checks that Compile refuses a bad policy
// before it looks at the module.
func TestCompileValidatesPolicyFirst(t *testing.T) {
	rt := newRuntime(t)
	_, err := rt.Compile(context.Background(), []byte("not wasm"), sandbox.NewPolicy().WithCallTimeout(0))
	if err == nil || !strings.Contains(err.Error(), "policy: call timeout") {
		t.Fatalf("Compile: %v, want the policy's error", err)
	}
}
