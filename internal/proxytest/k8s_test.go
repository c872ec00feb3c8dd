package proxytest_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestKubernetesManifests decodes every document of deploy/k8s (no cluster
// here) and checks what ties them together: the HAProxy ConfigMap is
// deploy/haproxy.cfg, its servers are the StatefulSet's pods, the pods'
// probes, secrets and grace.
func TestKubernetesManifests(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "deploy", "k8s", "*.yaml"))
	if len(files) == 0 {
		t.Fatal("no manifests in deploy/k8s")
	}
	objs := map[string]obj{} // "Kind/name"
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
			o := obj(doc)
			kind, name := o.str("kind"), o.str("metadata", "name")
			if o.str("apiVersion") == "" || kind == "" || name == "" {
				t.Fatalf("%s: document %d lacks apiVersion, kind or metadata.name", f, i)
			}
			objs[kind+"/"+name] = o
		}
	}
	get := func(key string) obj {
		o, ok := objs[key]
		if !ok {
			t.Fatalf("no %s in deploy/k8s", key)
		}
		return o
	}

	cfg, _ := os.ReadFile(filepath.Join("..", "..", "deploy", "haproxy.cfg"))
	if got := get("ConfigMap/haproxy").str("data", "haproxy.cfg"); got != string(cfg) {
		t.Error("ConfigMap haproxy's haproxy.cfg differs from deploy/haproxy.cfg: copy it again")
	}

	sts := get("StatefulSet/wasmtools")
	if svc := get("Service/" + sts.str("spec", "serviceName")); svc.str("spec", "clusterIP") != "None" {
		t.Error("the StatefulSet's service is not headless")
	}
	pod := sts.sub("spec", "template", "spec")
	c := pod.first("containers")
	args := fmt.Sprint(c.get("args"))
	for _, want := range []string{"--replica=$(POD_NAME)", "--state-store=redis://redis:6379/0"} {
		if !strings.Contains(args, want) {
			t.Errorf("wasmtools args %s lack %s", args, want)
		}
	}
	env := map[string]obj{}
	for _, e := range c.get("env").([]any) {
		env[obj(e.(map[string]any)).str("name")] = obj(e.(map[string]any))
	}
	for _, name := range []string{"WASMTOOLS_STATE_KEY", "WASMTOOLS_AUTH_TOKEN"} {
		secret := env[name].str("valueFrom", "secretKeyRef", "name")
		get("Secret/" + secret)
	}
	if c.str("readinessProbe", "httpGet", "path") != "/readyz" || c.str("livenessProbe", "httpGet", "path") != "/healthz" {
		t.Error("probes are not /readyz (readiness) and /healthz (liveness)")
	}
	for _, a := range c.get("args").([]any) {
		if v, ok := strings.CutPrefix(a.(string), "--shutdown-grace="); ok {
			d, _ := time.ParseDuration(v)
			if grace := time.Duration(pod.get("terminationGracePeriodSeconds").(int)) * time.Second; grace <= d+time.Second {
				t.Errorf("terminationGracePeriodSeconds %v is not over the drain's %v", grace, d)
			}
		}
	}

	// Every pod as the restricted Pod Security Standard asks: a namespace
	// enforcing it refuses any other, and so would a `kubectl apply -f
	// deploy/k8s/` there. A user by number: the kubelet cannot tell that an
	// image's user named by name (haproxy's, redis') is not root.
	for key, o := range objs {
		spec := o.sub("spec", "template", "spec")
		if spec == nil {
			continue
		}
		psc := spec.sub("securityContext")
		if psc.get("runAsNonRoot") != true || psc.get("runAsUser") == nil || psc.str("seccompProfile", "type") != "RuntimeDefault" {
			t.Errorf("%s: pod securityContext %v lacks runAsNonRoot, a runAsUser or the RuntimeDefault seccomp profile", key, psc)
		}
		for _, c := range spec.get("containers").([]any) {
			c := obj(c.(map[string]any))
			sc := c.sub("securityContext")
			if sc.get("allowPrivilegeEscalation") != false || sc.get("readOnlyRootFilesystem") != true || fmt.Sprint(sc.get("capabilities", "drop")) != "[ALL]" {
				t.Errorf("%s: container %s's securityContext %v: want allowPrivilegeEscalation false, readOnlyRootFilesystem, capabilities drop ALL", key, c.str("name"), sc)
			}
		}
	}

	// HAProxy's servers are the StatefulSet's pods, by name and DNS name.
	hc := get("Deployment/haproxy").first("spec", "template", "spec", "containers")
	var names []string
	for _, e := range hc.get("env").([]any) {
		e := obj(e.(map[string]any))
		if strings.HasSuffix(e.str("name"), "_NAME") {
			names = append(names, e.str("value"))
		}
		var n int
		if _, err := fmt.Sscanf(e.str("name"), "S%d_ADDR", &n); err == nil {
			if pod := fmt.Sprintf("wasmtools-%d", n-1); !strings.HasPrefix(e.str("value"), pod+".wasmtools.") {
				t.Errorf("%s = %s is not pod %s's DNS name", e.str("name"), e.str("value"), pod)
			}
		}
	}
	var pods []string
	for i := range sts.get("spec", "replicas").(int) {
		pods = append(pods, fmt.Sprintf("wasmtools-%d", i))
	}
	if !slices.Equal(names, pods) {
		t.Errorf("HAProxy's servers %v, the StatefulSet's pods %v", names, pods)
	}
}

// obj is a decoded YAML mapping.
type obj map[string]any

func (o obj) get(path ...string) any {
	var v any = map[string]any(o)
	for _, k := range path {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

func (o obj) str(path ...string) string { s, _ := o.get(path...).(string); return s }

func (o obj) sub(path ...string) obj { m, _ := o.get(path...).(map[string]any); return m }

// first is the first mapping of the list at path.
func (o obj) first(path ...string) obj {
	l, _ := o.get(path...).([]any)
	if len(l) == 0 {
		return nil
	}
	m, _ := l[0].(map[string]any)
	return m
}
