package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/config"
	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// TestDeployManifestsServe runs `wasmtools serve` as deploy/k8s's
// StatefulSet runs it, and as deploy/haproxy.cfg checks it: the
// container's args and environment as the manifest gives them (the pod's
// name for $(POD_NAME), the Secret's values), each volume a folder of its
// own (the plugins' one laid out as Kubernetes lays out a ConfigMap), and
// nothing writable outside the volumes, as under readOnlyRootFilesystem.
// Only the addresses change: --http to a loopback port, the Redis of the
// Service to a real redis-server. A flag the manifest names that serve
// lacks, a path outside a volume, or a probe that does not answer fails
// it. No cluster is run (TestKubernetesManifests checks how the
// manifests fit together).
func TestDeployManifestsServe(t *testing.T) {
	objs := proxytest.Manifests(t, filepath.Join("..", "..", "deploy", "k8s"))
	sts, secret := objs["StatefulSet/wasmtools"], objs["Secret/wasmtools"]
	if sts == nil || secret == nil {
		t.Fatal("deploy/k8s lacks StatefulSet/wasmtools or Secret/wasmtools")
	}
	pod := sts.Sub("spec", "template", "spec")
	c := pod.List("containers")[0]

	// A pod that runs as the restricted Pod Security Standard asks: any
	// namespace enforcing it refuses the pod otherwise.
	sc := c.Sub("securityContext")
	runAsNonRoot := sc.Get("runAsNonRoot") == true || pod.Get("securityContext", "runAsNonRoot") == true
	seccomp := cmp.Or(sc.Str("seccompProfile", "type"), pod.Str("securityContext", "seccompProfile", "type"))
	drop := fmt.Sprint(sc.Get("capabilities", "drop"))
	if !runAsNonRoot || sc.Get("allowPrivilegeEscalation") != false || sc.Get("readOnlyRootFilesystem") != true ||
		drop != "[ALL]" || (seccomp != "RuntimeDefault" && seccomp != "Localhost") {
		t.Errorf("wasmtools' securityContext is not restricted (runAsNonRoot, allowPrivilegeEscalation: false, readOnlyRootFilesystem, capabilities drop ALL, a seccomp profile): container %v, pod %v",
			sc, pod.Get("securityContext"))
	}

	// Each volume mount becomes a folder; the plugins' ConfigMap is laid
	// out as the kubelet does (files linked through ..data), which is what
	// the watcher follows.
	volumes := map[string]proxytest.Obj{}
	for _, v := range pod.List("volumes") {
		volumes[v.Str("name")] = v
	}
	root := t.TempDir()
	mounts := map[string]string{} // mountPath → folder here
	for _, m := range c.List("volumeMounts") {
		v := volumes[m.Str("name")]
		if v == nil {
			t.Fatalf("volume mount %s names no volume of the pod", m.Str("name"))
		}
		if m.Str("subPath") != "" {
			t.Errorf("volume mount %s has a subPath: Kubernetes never updates a subPath mount, so hot reload would not see a change", m.Str("mountPath"))
		}
		dir := filepath.Join(root, m.Str("name"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mounts[m.Str("mountPath")] = dir
	}
	inMount := func(p string) (string, bool) {
		for mp, dir := range mounts {
			if rest, ok := strings.CutPrefix(p, mp); ok && (rest == "" || rest[0] == '/') {
				return dir + rest, true
			}
		}
		return "", false
	}

	// The environment: the pod's name, the Secret's values; HOME and the
	// temporary folder are where a read-only root file system would
	// refuse writes, unless a volume is mounted there.
	const podName = "wasmtools-0"
	blocked := filepath.Join(root, "read-only-root")
	os.WriteFile(blocked, nil, 0o444) // a file: nothing can be made under it
	env := map[string]string{"HOME": blocked + "/home/nonroot", "TMPDIR": blocked + "/tmp"}
	if dir, ok := inMount("/tmp"); ok {
		env["TMPDIR"] = dir
	}
	for _, e := range c.List("env") {
		name := e.Str("name")
		switch {
		case e.Get("value") != nil:
			env[name] = e.Str("value")
		case e.Str("valueFrom", "fieldRef", "fieldPath") == "metadata.name":
			env[name] = podName
		case e.Sub("valueFrom", "secretKeyRef") != nil:
			ref := e.Sub("valueFrom", "secretKeyRef")
			if ref.Str("name") != "wasmtools" {
				t.Fatalf("env %s: Secret %s is not in deploy/k8s", name, ref.Str("name"))
			}
			v := secret.Str("stringData", ref.Str("key"))
			if v == "" {
				t.Fatalf("env %s: Secret wasmtools has no %s", name, ref.Str("key"))
			}
			env[name] = v
		default:
			t.Fatalf("env %s: a source the test does not know: %v", name, e)
		}
	}
	if env["WASMTOOLS_OPERATOR_TOKEN"] == "" {
		t.Error("no WASMTOOLS_OPERATOR_TOKEN: /metrics cannot be scraped and /status not read from outside the pod, and POST /drain is not served (the preStop hook the manifest shows needs it)")
	}

	// The args, with $(VAR) expanded as Kubernetes does, the addresses
	// moved to this machine and the volumes' paths to their folders.
	redis := proxytest.StartRedis(t)
	addr := freeAddr(t)
	var args, pluginDirs []string
	for _, a := range c.List("args") {
		a := expandK8s(string(a.Scalar()), env)
		name, value, isFlag := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case !strings.HasPrefix(a, "-"):
			dir, ok := inMount(a)
			if !ok && strings.HasPrefix(a, "/") {
				t.Fatalf("plugin path %s is not a volume mount: the container has nothing there", a)
			}
			if ok {
				pluginDirs = append(pluginDirs, dir)
				a = dir
			}
		case !isFlag:
			t.Fatalf("arg %s: write flags as --name=value, so that this test can read them", a)
		case name == "http":
			a = "--http=" + addr
		case name == "state-store":
			if !strings.HasPrefix(value, "redis://redis:6379/") {
				t.Fatalf("--state-store=%s: not the redis Service of deploy/k8s/redis.yaml", value)
			}
			a = "--state-store=redis://" + redis + strings.TrimPrefix(value, "redis://redis:6379")
		case strings.HasPrefix(value, "/"):
			dir, ok := inMount(value)
			if !ok {
				t.Fatalf("--%s=%s is not under a volume mount: the root file system is read-only", name, value)
			}
			a = "--" + name + "=" + dir
		}
		args = append(args, a)
	}
	if len(pluginDirs) == 0 {
		t.Fatal("no plugin folder among the args")
	}
	// ConfigMaps in a ConfigMap volume's layout: those deploy/k8s defines
	// with their data, the plugins' (the operator's) with a plugin.
	for _, m := range c.List("volumeMounts") {
		name := volumes[m.Str("name")].Str("configMap", "name")
		if name == "" {
			continue
		}
		files := map[string][]byte{}
		if cm := objs["ConfigMap/"+name]; cm != nil {
			for k, v := range cm.Sub("data") {
				files[k] = []byte(v.(string))
			}
		} else {
			files["counter.wasm"] = testplugins.Bytes(t, testplugins.Example(t, "counter"))
		}
		dir := mounts[m.Str("mountPath")]
		data := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
		os.Mkdir(data, 0o755)
		for k, v := range files {
			if err := os.WriteFile(filepath.Join(data, k), v, 0o644); err != nil {
				t.Fatal(err)
			}
			os.Symlink("..data/"+k, filepath.Join(dir, k))
		}
		os.Symlink(filepath.Base(data), filepath.Join(dir, "..data"))
	}
	checkMemory(t, c, args)

	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = []string{"WASMTOOLS_TEST_MAIN=1", "PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	probe := func(path string, header http.Header) (int, string, error) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		copyHeader(req.Header, header)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), nil
	}
	ready := c.Str("readinessProbe", "httpGet", "path")
	proc := proxytest.StartWithin(t, cmd, 2*time.Minute, func() error {
		code, body, err := probe(ready, nil)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("%s: %d %s", ready, code, body)
		}
		return err
	})
	defer func() {
		if t.Failed() {
			t.Logf("wasmtools:\n%s", proc.Output())
		}
	}()

	// The probes, as Kubernetes sends them: no token.
	for _, p := range []string{"readinessProbe", "livenessProbe"} {
		get := c.Sub(p, "httpGet")
		if port := get.Str("port"); port != "" && !hasPort(c, port) {
			t.Errorf("%s's port %q is not a port of the container", p, port)
		}
		code, body, err := probe(get.Str("path"), nil)
		if err != nil || code != http.StatusOK {
			t.Errorf("%s GET %s: %d %q %v", p, get.Str("path"), code, body, err)
		}
	}
	if _, body, _ := probe(ready, nil); body != "ready "+podName+"\n" {
		t.Errorf("%s = %q, want the pod's name as the replica's", ready, body)
	}
	// The plugin, from the ConfigMap's layout, is served.
	operator := http.Header{"Authorization": {"Bearer " + env["WASMTOOLS_OPERATOR_TOKEN"]}}
	if code, body, err := probe("/status", operator); err != nil || code != http.StatusOK ||
		!regexp.MustCompile(`"name": "counter",[^}]*"state": "loaded"`).MatchString(body) {
		t.Errorf("/status: %d %v, counter not loaded from the plugins' volume:\n%s", code, err, body)
	}
	// A scraper elsewhere in the cluster, with the operator's token.
	code, body, err := probe("/metrics", http.Header{
		"Authorization":   {"Bearer " + env["WASMTOOLS_OPERATOR_TOKEN"]},
		"X-Forwarded-For": {"10.1.2.3"},
	})
	if err != nil || code != http.StatusOK || !strings.Contains(body, "wasmtools_instances_created_total") && !strings.Contains(body, "wasmtools_http_sessions") {
		t.Errorf("/metrics for a scraper with the Secret's operator token: %d %v", code, err)
	}

	// HAProxy's health check, as deploy/haproxy.cfg words it: HTTP/1.0,
	// no Host header, no token.
	cfg, err := os.ReadFile(filepath.Join("..", "..", "deploy", "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*option httpchk (\S+) (\S+)\s*$`).FindSubmatch(cfg)
	want := regexp.MustCompile(`(?m)^\s*http-check expect status (\d+)\s*$`).FindSubmatch(cfg)
	if m == nil || want == nil {
		t.Fatal("deploy/haproxy.cfg has no `option httpchk METHOD PATH` and `http-check expect status N`")
	}
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "%s %s HTTP/1.0\r\n\r\n", m[1], m[2])
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !regexp.MustCompile(`^HTTP/1\.[01] `+string(want[1])+` `).MatchString(status) {
		t.Errorf("HAProxy's check %s %s: %q %v, want status %s", m[1], m[2], status, err, want[1])
	}
}

// checkMemory checks that the container's memory limit holds what the
// replica may use: its guests' memories, bounded by [limits]
// memory_budget (no bound without it), their calls' stacks, which no
// budget counts (up to about 190 MiB each, docs/SECURITY.md, "Memory
// limits are per instance"), bounded by max_concurrent_calls, and the Go
// heap and compiled code (256 MiB allowed). Past the limit the kernel
// kills the replica, every session on it moving at once, where wasmtools
// would have refused or evicted an instance.
func checkMemory(t *testing.T, c proxytest.Obj, args []string) {
	t.Helper()
	limit := k8sQuantity(t, c.Str("resources", "limits", "memory"))
	var cfg *config.File
	for _, a := range args {
		if path, ok := strings.CutPrefix(a, "--config="); ok {
			var err error
			if cfg, err = config.Load(path, func(string) (string, bool) { return "", false }); err != nil {
				t.Fatalf("--config: %v", err)
			}
		}
	}
	if cfg == nil || cfg.Limits.MemoryBudget == 0 || cfg.Limits.MaxConcurrentCalls == 0 {
		t.Fatalf("no --config with [limits] memory_budget and max_concurrent_calls: the guests' memory has no bound under the container's memory limit (%d MiB)", limit>>20)
	}
	const stack, heap = 190 << 20, 256 << 20
	if need := uint64(cfg.Limits.MemoryBudget) + uint64(cfg.Limits.MaxConcurrentCalls)*stack + heap; need > limit {
		t.Errorf("memory_budget %d MiB + %d calls' stacks + the Go heap = %d MiB, over the container's limit of %d MiB",
			uint64(cfg.Limits.MemoryBudget)>>20, cfg.Limits.MaxConcurrentCalls, need>>20, limit>>20)
	}
}

// k8sQuantity reads a Kubernetes memory quantity in Ki, Mi or Gi.
func k8sQuantity(t *testing.T, q string) uint64 {
	t.Helper()
	for suffix, mult := range map[string]uint64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(q, suffix); ok {
			var v uint64
			if _, err := fmt.Sscan(n, &v); err == nil {
				return v * mult
			}
		}
	}
	t.Fatalf("memory quantity %q: want a number of Ki, Mi or Gi", q)
	return 0
}

// expandK8s expands $(VAR) in s from env, as Kubernetes does in a
// container's args.
func expandK8s(s string, env map[string]string) string {
	return regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

func hasPort(c proxytest.Obj, name string) bool {
	for _, p := range c.List("ports") {
		if p.Str("name") == name {
			return true
		}
	}
	return false
}

func copyHeader(dst, src http.Header) {
	for k, v := range src {
		dst[k] = v
	}
}
