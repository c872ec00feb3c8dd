package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"go.yaml.in/yaml/v3"

	"github.com/wasmtools/wasmtools/plugins"
)

// hyperConfig is hyper-mcp's configuration file (src/config.rs), in JSON,
// YAML or TOML by the file's extension, as hyper-mcp reads it. plugins is
// a map by name (hyper-mcp 0.2 on) or a list of entries with a name (the
// earlier form, still in its DEPLOYMENT.md).
type hyperConfig struct {
	Auths          map[string]hyperAuth `json:"auths" yaml:"auths" toml:"auths"`
	DynamicLoading bool                 `json:"dynamic_loading" yaml:"dynamic_loading" toml:"dynamic_loading"`
	// hyper-mcp's newer server switches: accepted when false.
	DisableCompletions bool     `json:"disable_completions" yaml:"disable_completions" toml:"disable_completions"`
	DisableLogging     bool     `json:"disable_logging" yaml:"disable_logging" toml:"disable_logging"`
	OCI                hyperOCI `json:"oci" yaml:"oci" toml:"oci"`
}

type hyperByName struct {
	hyperConfig `yaml:",inline"`
	Plugins     map[string]hyperPlugin `json:"plugins" yaml:"plugins" toml:"plugins"`
}

type hyperByList struct {
	hyperConfig `yaml:",inline"`
	Plugins     []hyperPlugin `json:"plugins" yaml:"plugins" toml:"plugins"`
}

type hyperAuth struct {
	Type     string `json:"type" yaml:"type" toml:"type"`
	Username string `json:"username" yaml:"username" toml:"username"`
	Password string `json:"password" yaml:"password" toml:"password"`
	Token    string `json:"token" yaml:"token" toml:"token"`
	Service  string `json:"service" yaml:"service" toml:"service"`
	User     string `json:"user" yaml:"user" toml:"user"`
}

type hyperOCI struct {
	InsecureSkipSignature *bool   `json:"insecure_skip_signature" yaml:"insecure_skip_signature" toml:"insecure_skip_signature"`
	UseSigstoreTUFData    *bool   `json:"use_sigstore_tuf_data" yaml:"use_sigstore_tuf_data" toml:"use_sigstore_tuf_data"`
	RekorPubKeys          *string `json:"rekor_pub_keys" yaml:"rekor_pub_keys" toml:"rekor_pub_keys"`
	FulcioCerts           *string `json:"fulcio_certs" yaml:"fulcio_certs" toml:"fulcio_certs"`
	CertIssuer            *string `json:"cert_issuer" yaml:"cert_issuer" toml:"cert_issuer"`
	CertEmail             *string `json:"cert_email" yaml:"cert_email" toml:"cert_email"`
	CertURL               *string `json:"cert_url" yaml:"cert_url" toml:"cert_url"`
}

type hyperPlugin struct {
	Name          string        `json:"name" yaml:"name" toml:"name"`
	URL           string        `json:"url" yaml:"url" toml:"url"`
	Path          string        `json:"path" yaml:"path" toml:"path"`
	RuntimeConfig *hyperRuntime `json:"runtime_config" yaml:"runtime_config" toml:"runtime_config"`
}

type hyperRuntime struct {
	SkipTools             []string          `json:"skip_tools" yaml:"skip_tools" toml:"skip_tools"`
	SkipPrompts           []string          `json:"skip_prompts" yaml:"skip_prompts" toml:"skip_prompts"`
	SkipResources         []string          `json:"skip_resources" yaml:"skip_resources" toml:"skip_resources"`
	SkipResourceTemplates []string          `json:"skip_resource_templates" yaml:"skip_resource_templates" toml:"skip_resource_templates"`
	AllowedHosts          []string          `json:"allowed_hosts" yaml:"allowed_hosts" toml:"allowed_hosts"`
	AllowedPaths          []string          `json:"allowed_paths" yaml:"allowed_paths" toml:"allowed_paths"`
	AllowedSecrets        []hyperSecret     `json:"allowed_secrets" yaml:"allowed_secrets" toml:"allowed_secrets"`
	EnvVars               map[string]string `json:"env_vars" yaml:"env_vars" toml:"env_vars"`
	MemoryLimit           string            `json:"memory_limit" yaml:"memory_limit" toml:"memory_limit"`
	ToolNamePrefix        *string           `json:"tool_name_prefix" yaml:"tool_name_prefix" toml:"tool_name_prefix"`
}

type hyperSecret struct {
	Service string `json:"service" yaml:"service" toml:"service"`
	User    string `json:"user" yaml:"user" toml:"user"`
}

func strictJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// LoadHyperMCP reads hyper-mcp's configuration file and maps it to ours,
// with hyper-mcp's meaning: each plugin gets its url as source (oci://,
// https://, file://), hyper-mcp's tool namespace (NAME-tool) as prefix
// unless it sets tool_name_prefix, and its runtime_config: allowed_hosts
// (read as Extism reads them: sandbox.Network.Extism), allowed_paths
// ("host" or "host:guest", granted read-write as hyper-mcp does),
// env_vars (as Extism config keys, which is how hyper-mcp passes them),
// memory_limit, skip_tools (as tools.deny_regexp), skip_prompts,
// skip_resources and skip_resource_templates (plugins.Skip); auths become
// logins for HTTPS sources by URL prefix, and oci.insecure_skip_signature
// the default of insecure_skip_signature. A setting that cannot be mapped
// is an error naming it: keyless verification (oci.use_sigstore_tuf_data =
// true, cert_*, fulcio_certs, rekor_pub_keys), keyring logins,
// dynamic_loading, disable_completions, disable_logging, s3:// URLs.
// allowed_secrets are keyring entries, whose values wasmtools does not
// read from the keyring: each must be given in our configuration, as
// [plugins.NAME] secrets (checked by [File.Overlay]).
//
// getenv resolves ${VAR} in the mapped strings as [Parse] does.
func LoadHyperMCP(path string, getenv func(string) (string, bool)) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("hyper-mcp config %s: %w", path, err)
	}
	var h hyperConfig
	var entries map[string]hyperPlugin
	var list []hyperPlugin
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".json":
		var probe struct {
			Plugins json.RawMessage `json:"plugins"`
		}
		if err = json.Unmarshal(b, &probe); err == nil {
			if p := bytes.TrimSpace(probe.Plugins); len(p) > 0 && p[0] == '[' {
				var c hyperByList
				err, h, list = strictJSON(b, &c), c.hyperConfig, c.Plugins
			} else {
				var c hyperByName
				err, h, entries = strictJSON(b, &c), c.hyperConfig, c.Plugins
			}
		}
	case ".yaml", ".yml":
		var probe struct {
			Plugins yaml.Node `yaml:"plugins"`
		}
		if err = yaml.Unmarshal(b, &probe); err == nil {
			d := yaml.NewDecoder(bytes.NewReader(b))
			d.KnownFields(true)
			if probe.Plugins.Kind == yaml.SequenceNode {
				var c hyperByList
				err, h, list = d.Decode(&c), c.hyperConfig, c.Plugins
			} else {
				var c hyperByName
				err, h, entries = d.Decode(&c), c.hyperConfig, c.Plugins
			}
		}
	case ".toml":
		var md toml.MetaData
		var probe map[string]any
		if md, err = toml.Decode(string(b), &probe); err == nil {
			if _, isList := probe["plugins"].([]map[string]any); isList {
				var c hyperByList
				md, err = toml.Decode(string(b), &c)
				h, list = c.hyperConfig, c.Plugins
			} else {
				var c hyperByName
				md, err = toml.Decode(string(b), &c)
				h, entries = c.hyperConfig, c.Plugins
			}
			if err == nil {
				if keys := md.Undecoded(); len(keys) > 0 {
					names := make([]string, len(keys))
					for i, k := range keys {
						names[i] = k.String()
					}
					err = fmt.Errorf("unknown settings: %s", strings.Join(names, ", "))
				}
			}
		}
	default:
		err = fmt.Errorf("unsupported format %q: hyper-mcp reads .json, .yaml, .yml and .toml", ext)
	}
	if err != nil {
		return nil, fmt.Errorf("hyper-mcp config %s: %w", path, err)
	}
	f, err := h.mapped(entries, list)
	if err != nil {
		return nil, fmt.Errorf("hyper-mcp config %s: %w", path, err)
	}
	if err := f.finish(getenv); err != nil {
		return nil, fmt.Errorf("hyper-mcp config %s: %w", path, err)
	}
	f.relativeTo(filepath.Dir(path))
	return f, nil
}

var hyperSize = regexp.MustCompile(`^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$`)

// parseHyperSize reads hyper-mcp's memory_limit (bytesize): "512Mi",
// "256MB", "1 GiB", "1048576".
func parseHyperSize(s string) (uint64, error) {
	m := hyperSize.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("size %q: want a number and a unit such as Mi, MiB, MB", s)
	}
	mult := map[string]uint64{
		"": 1, "b": 1,
		"k": 1e3, "kb": 1e3, "ki": 1 << 10, "kib": 1 << 10,
		"m": 1e6, "mb": 1e6, "mi": 1 << 20, "mib": 1 << 20,
		"g": 1e9, "gb": 1e9, "gi": 1 << 30, "gib": 1 << 30,
	}[strings.ToLower(m[2])]
	if mult == 0 {
		return 0, fmt.Errorf("size %q: unknown unit %q", s, m[2])
	}
	tooBig := fmt.Errorf("size %q: over 2^64 bytes", s)
	// A whole number is read exactly: a float holds only 53 bits.
	if n, err := strconv.ParseUint(m[1], 10, 64); err == nil {
		if n > math.MaxUint64/mult { // n * mult would wrap around
			return 0, tooBig
		}
		return n * mult, nil
	} else if errors.Is(err, strconv.ErrRange) {
		return 0, tooBig
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %v", s, err)
	}
	// A float-to-integer conversion out of range gives an arbitrary
	// value; 1<<64 is exact as a float64.
	if v := n * float64(mult); v < 1<<64 {
		return uint64(v), nil
	}
	return 0, tooBig
}

func (h *hyperConfig) mapped(byName map[string]hyperPlugin, list []hyperPlugin) (*File, error) {
	var errs []error
	bad := func(setting, why string) { errs = append(errs, fmt.Errorf("%s: %s", setting, why)) }
	f := &File{Plugins: map[string]Plugin{}, Registries: map[string]Credential{}, urlAuths: map[string]Credential{}}
	if h.DynamicLoading {
		bad("dynamic_loading", "wasmtools does not let clients load plugins at run time")
	}
	if h.DisableCompletions || h.DisableLogging {
		bad("disable_completions/disable_logging", "not supported: wasmtools serves completion and logging to the plugins that offer them")
	}
	o := h.OCI
	if o.InsecureSkipSignature != nil {
		f.Defaults.InsecureSkipSignature = o.InsecureSkipSignature
	}
	if o.UseSigstoreTUFData != nil && *o.UseSigstoreTUFData {
		bad("oci.use_sigstore_tuf_data", "keyless verification against Sigstore's public trust root is not supported: give a public key (--public-key, or public_key in --config)")
	}
	for setting, v := range map[string]*string{"oci.rekor_pub_keys": o.RekorPubKeys, "oci.fulcio_certs": o.FulcioCerts, "oci.cert_issuer": o.CertIssuer, "oci.cert_email": o.CertEmail, "oci.cert_url": o.CertURL} {
		if v != nil {
			bad(setting, "keyless verification (certificate identities) is not supported: give a public key (--public-key, or public_key in --config)")
		}
	}
	for _, key := range slices.Sorted(maps.Keys(h.Auths)) {
		a := h.Auths[key]
		u, err := url.Parse(key)
		if err != nil || u.Host == "" {
			bad("auths."+key, "want a URL")
			continue
		}
		// As hyper-mcp's Url key: a URL without a path ends in "/".
		prefix := key
		if u.Path == "" && u.RawQuery == "" && u.Fragment == "" {
			prefix += "/"
		}
		switch a.Type {
		case "basic":
			f.urlAuths[prefix] = Credential{Username: a.Username, Password: a.Password}
		case "token":
			f.urlAuths[prefix] = Credential{Token: a.Token}
		case "keyring":
			bad("auths."+key, "type keyring: wasmtools does not read the system keyring; give the login in --config as [registries.\""+u.Host+"\"]")
		default:
			bad("auths."+key+".type", fmt.Sprintf("%q is not basic, token or keyring", a.Type))
		}
	}
	entries := map[string]hyperPlugin{}
	maps.Copy(entries, byName)
	for i, p := range list {
		if p.Name == "" {
			bad(fmt.Sprintf("plugins[%d].name", i), "missing")
			continue
		}
		if _, dup := entries[p.Name]; dup {
			bad(fmt.Sprintf("plugins[%d].name", i), fmt.Sprintf("%q is named twice", p.Name))
		}
		entries[p.Name] = p
	}
	for _, name := range slices.Sorted(maps.Keys(entries)) {
		p := entries[name]
		where := "plugins." + name
		src := p.URL
		if src == "" {
			src = p.Path
		}
		var out Plugin
		switch {
		case src == "":
			bad(where+".url", "missing")
		case strings.HasPrefix(src, "oci://"), strings.HasPrefix(src, "https://"), strings.HasPrefix(src, "http://"), strings.HasPrefix(src, "file://"):
			out.Source = src
		default:
			bad(where+".url", fmt.Sprintf("%q: wasmtools fetches oci://, https:// and file:// plugins", src))
		}
		out.Prefix = name + "-"
		if rc := p.RuntimeConfig; rc != nil {
			if rc.ToolNamePrefix != nil {
				out.Prefix = *rc.ToolNamePrefix
			}
			out.Tools.DenyRegexp = rc.SkipTools
			out.hyperSkip = plugins.Skip{Prompts: rc.SkipPrompts, Resources: rc.SkipResources, ResourceTemplates: rc.SkipResourceTemplates}
			for setting, res := range map[string][]string{"skip_tools": rc.SkipTools, "skip_prompts": rc.SkipPrompts, "skip_resources": rc.SkipResources, "skip_resource_templates": rc.SkipResourceTemplates} {
				for i, re := range res {
					if _, err := regexp.Compile(re); err != nil {
						bad(fmt.Sprintf("%s.runtime_config.%s[%d]", where, setting, i), err.Error())
					}
				}
			}
			out.AllowedHosts, out.hyperHosts = rc.AllowedHosts, rc.AllowedHosts != nil
			for i, ap := range rc.AllowedPaths {
				host, guest, ok := strings.Cut(ap, ":")
				host, guest = strings.TrimSpace(host), strings.TrimSpace(guest)
				if !ok || guest == "" {
					guest = host
				}
				if !filepath.IsAbs(host) {
					bad(fmt.Sprintf("%s.runtime_config.allowed_paths[%d]", where, i), fmt.Sprintf("%q: want an absolute host path", ap))
					continue
				}
				out.AllowedPaths = append(out.AllowedPaths, Path{Host: host, Guest: guest, Mode: "rw"})
			}
			// hyper-mcp passes env_vars as Extism config keys
			// (manifest.with_config_key), which plugins read with
			// config_get, not as environment variables.
			out.Config = rc.EnvVars
			if rc.MemoryLimit != "" {
				n, err := parseHyperSize(rc.MemoryLimit)
				if err != nil {
					bad(where+".runtime_config.memory_limit", err.Error())
				}
				out.MemoryLimit = Size(n)
			}
			for _, s := range rc.AllowedSecrets {
				if out.hyperSecrets == nil {
					out.hyperSecrets = map[string]bool{}
				}
				out.hyperSecrets[s.Service+"/"+s.User] = true
			}
		}
		f.Plugins[name] = out
	}
	return f, errors.Join(errs...)
}

// Overlay adds the plugins of h (a mapped hyper-mcp configuration) to f.
// A plugin in both takes f's settings where f sets them: the operator's
// own configuration adds what hyper-mcp's cannot say (public keys, pins,
// secrets' values) and may tighten the rest. A secret that hyper-mcp's
// allowed_secrets grants must be given in f's secrets.
func (f *File) Overlay(h *File) error {
	if f.Plugins == nil {
		f.Plugins = map[string]Plugin{}
	}
	if f.Registries == nil {
		f.Registries = map[string]Credential{}
	}
	for host, c := range h.Registries {
		if _, ok := f.Registries[host]; !ok {
			f.Registries[host] = c
		}
	}
	if len(h.urlAuths) > 0 && f.urlAuths == nil {
		f.urlAuths = map[string]Credential{}
	}
	for prefix, c := range h.urlAuths {
		if _, ok := f.urlAuths[prefix]; !ok {
			f.urlAuths[prefix] = c
		}
	}
	if f.Defaults.InsecureSkipSignature == nil {
		f.Defaults.InsecureSkipSignature = h.Defaults.InsecureSkipSignature
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(h.Plugins)) {
		hp := h.Plugins[name]
		p, ok := f.Plugins[name]
		if !ok {
			p = hp
		} else {
			if p.Source != "" && p.Source != hp.Source {
				errs = append(errs, fmt.Errorf("plugins.%s.source: %q in --config, %q in the hyper-mcp configuration", name, p.Source, hp.Source))
			}
			p.Source = hp.Source
			if p.Prefix == "" {
				p.Prefix = hp.Prefix
			}
			if p.AllowedHosts == nil {
				p.AllowedHosts, p.hyperHosts = hp.AllowedHosts, hp.hyperHosts
			}
			if p.AllowedPaths == nil {
				p.AllowedPaths = hp.AllowedPaths
			}
			if p.Config == nil {
				p.Config = hp.Config
			}
			p.hyperSkip = hp.hyperSkip
			if p.MemoryLimit == 0 {
				p.MemoryLimit = hp.MemoryLimit
			}
			if p.Tools.DenyRegexp == nil {
				p.Tools.DenyRegexp = hp.Tools.DenyRegexp
			}
			p.hyperSecrets = hp.hyperSecrets
		}
		for _, k := range slices.Sorted(maps.Keys(p.hyperSecrets)) {
			if _, ok := p.Secrets[k]; !ok {
				errs = append(errs, fmt.Errorf("plugins.%s.runtime_config.allowed_secrets: %q is a keyring entry, which wasmtools does not read: give its value in --config as [plugins.%s] secrets = { %q = \"${VAR}\" }", name, k, name, k))
			}
		}
		f.Plugins[name] = p
	}
	return errors.Join(errs...)
}
