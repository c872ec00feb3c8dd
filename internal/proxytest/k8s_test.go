package proxytest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestKubernetesManifests decodes every document of deploy/k8s (no cluster
// here) and checks what ties them together: the HAProxy ConfigMap is
// deploy/haproxy.cfg, its servers are the StatefulSet's pods, the pods'
// probes, secrets and grace.
func TestKubernetesManifests(t *testing.T) {
	objs := proxytest.Manifests(t, filepath.Join("..", "..", "deploy", "k8s")) // "Kind/name"
	get := func(key string) proxytest.Obj {
		o, ok := objs[key]
		if !ok {
			t.Fatalf("no %s in deploy/k8s", key)
		}
		return o
	}

	cfg, _ := os.ReadFile(filepath.Join("..", "..", "deploy", "haproxy.cfg"))
	if got := get("ConfigMap/haproxy").Str("data", "haproxy.cfg"); got != string(cfg) {
		t.Error("ConfigMap haproxy's haproxy.cfg differs from deploy/haproxy.cfg: copy it again")
	}

	sts := get("StatefulSet/wasmtools")
	if svc := get("Service/" + sts.Str("spec", "serviceName")); svc.Str("spec", "clusterIP") != "None" {
		t.Error("the StatefulSet's service is not headless")
	}
	pod := sts.Sub("spec", "template", "spec")
	c := pod.First("containers")
	args := fmt.Sprint(c.Get("args"))
	for _, want := range []string{"--replica=$(POD_NAME)", "--state-store=redis://redis:6379/0"} {
		if !strings.Contains(args, want) {
			t.Errorf("wasmtools args %s lack %s", args, want)
		}
	}
	env := map[string]proxytest.Obj{}
	for _, e := range c.List("env") {
		env[e.Str("name")] = e
	}
	for _, name := range []string{"WASMTOOLS_STATE_KEY", "WASMTOOLS_AUTH_TOKEN"} {
		secret := env[name].Str("valueFrom", "secretKeyRef", "name")
		get("Secret/" + secret)
	}
	if c.Str("readinessProbe", "httpGet", "path") != "/readyz" || c.Str("livenessProbe", "httpGet", "path") != "/healthz" {
		t.Error("probes are not /readyz (readiness) and /healthz (liveness)")
	}
	for _, a := range c.Get("args").([]any) {
		if v, ok := strings.CutPrefix(a.(string), "--shutdown-grace="); ok {
			d, _ := time.ParseDuration(v)
			if grace := time.Duration(pod.Get("terminationGracePeriodSeconds").(int)) * time.Second; grace <= d+time.Second {
				t.Errorf("terminationGracePeriodSeconds %v is not over the drain's %v", grace, d)
			}
		}
	}

	// Every pod as the restricted Pod Security Standard asks: a namespace
	// enforcing it refuses any other, and so would a `kubectl apply -f
	// deploy/k8s/` there. A user by number: the kubelet cannot tell that an
	// image's user named by name (haproxy's, redis') is not root.
	for key, o := range objs {
		spec := o.Sub("spec", "template", "spec")
		if spec == nil {
			continue
		}
		psc := spec.Sub("securityContext")
		if psc.Get("runAsNonRoot") != true || psc.Get("runAsUser") == nil || psc.Str("seccompProfile", "type") != "RuntimeDefault" {
			t.Errorf("%s: pod securityContext %v lacks runAsNonRoot, a runAsUser or the RuntimeDefault seccomp profile", key, psc)
		}
		for _, c := range spec.List("containers") {
			sc := c.Sub("securityContext")
			if sc.Get("allowPrivilegeEscalation") != false || sc.Get("readOnlyRootFilesystem") != true || fmt.Sprint(sc.Get("capabilities", "drop")) != "[ALL]" {
				t.Errorf("%s: container %s's securityContext %v: want allowPrivilegeEscalation false, readOnlyRootFilesystem, capabilities drop ALL", key, c.Str("name"), sc)
			}
		}
	}

	// HAProxy's servers are the StatefulSet's pods, by name and DNS name.
	hc := get("Deployment/haproxy").First("spec", "template", "spec", "containers")
	var names []string
	for _, e := range hc.List("env") {
		if strings.HasSuffix(e.Str("name"), "_NAME") {
			names = append(names, e.Str("value"))
		}
		var n int
		if _, err := fmt.Sscanf(e.Str("name"), "S%d_ADDR", &n); err == nil {
			if pod := fmt.Sprintf("wasmtools-%d", n-1); !strings.HasPrefix(e.Str("value"), pod+".wasmtools.") {
				t.Errorf("%s = %s is not pod %s's DNS name", e.Str("name"), e.Str("value"), pod)
			}
		}
	}
	var pods []string
	for i := range sts.Get("spec", "replicas").(int) {
		pods = append(pods, fmt.Sprintf("wasmtools-%d", i))
	}
	if !slices.Equal(names, pods) {
		t.Errorf("HAProxy's servers %v, the StatefulSet's pods %v", names, pods)
	}
}
