// Package deploy holds the container builds and Kubernetes manifests for
// running dflash_server replicas behind the Gateway API Inference
// Extension (docs/SCALE-OUT.md), and decodes those manifests into the real
// Kubernetes API types so tests can check them: a misspelt field fails
// `make test` instead of a rollout.
package deploy

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

//go:embed k8s/*.yaml
var manifests embed.FS

// Object is one decoded manifest document.
type Object struct {
	// File is the manifest's path under deploy/, for messages.
	File string
	// Kind and APIVersion as written.
	Kind, APIVersion string
	// Value is a pointer to the typed API object (*appsv1.Deployment,
	// *corev1.Service, *inferencev1.InferencePool, ...).
	Value any
}

// InferencePoolAPIVersion is the inference extension's GA API group and
// version, whose Go types (sigs.k8s.io/gateway-api-inference-extension/api/v1)
// decode the pool.
var InferencePoolAPIVersion = inferencev1.GroupVersion.String()

// typed names the Go type each supported apiVersion/kind decodes into.
// Unknown kinds are an error: a manifest the test cannot check is a
// manifest that can silently rot.
func typed(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "gateway.networking.k8s.io/v1 HTTPRoute":
		return &gatewayv1.HTTPRoute{}, nil
	case InferencePoolAPIVersion + " InferencePool":
		return &inferencev1.InferencePool{}, nil
	}
	return nil, fmt.Errorf("no API type for %s %s", apiVersion, kind)
}

// Load decodes every document of every manifest under k8s/, rejecting
// fields the API type does not have.
func Load() ([]Object, error) {
	files, err := fs.Glob(manifests, "k8s/*.yaml")
	if err != nil {
		return nil, fmt.Errorf("list manifests: %w", err)
	}
	var out []Object
	for _, f := range files {
		data, err := manifests.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		for i, doc := range splitDocs(data) {
			o, err := decode(doc)
			if err != nil {
				return nil, fmt.Errorf("%s document %d: %w", f, i+1, err)
			}
			o.File = path.Join("deploy", f)
			out = append(out, o)
		}
	}
	return out, nil
}

// splitDocs cuts a YAML stream at its "---" separators, dropping documents
// that hold only comments.
func splitDocs(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(data, []byte("\n---")) {
		empty := true
		for _, line := range strings.Split(string(d), "\n") {
			t := strings.TrimSpace(line)
			if t != "" && !strings.HasPrefix(t, "#") && t != "---" {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, d)
		}
	}
	return docs
}

func decode(doc []byte) (Object, error) {
	// YAML → JSON first (duplicate keys rejected), then the API type's own
	// JSON tags decide which fields exist.
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return Object{}, fmt.Errorf("yaml: %w", err)
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return Object{}, fmt.Errorf("type meta: %w", err)
	}
	v, err := typed(tm.APIVersion, tm.Kind)
	if err != nil {
		return Object{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Object{}, fmt.Errorf("decode %s: %w", tm.Kind, err)
	}
	return Object{Kind: tm.Kind, APIVersion: tm.APIVersion, Value: v}, nil
}

// Flag returns the value of --name=value (or --name value) in args, and
// whether it is there.
func Flag(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// PickerMetricFlags are the endpoint picker's flags that name a model
// server metric, in the order the Model Server Protocol lists them.
var PickerMetricFlags = []string{
	"total-queued-requests-metric",
	"total-running-requests-metric",
	"kv-cache-usage-percentage-metric",
	"lora-info-metric",
}

// PickerMetrics reads the metric names the endpoint picker Deployment
// (container "epp") is configured with, by flag name; an empty value turns
// that signal off.
func PickerMetrics() (map[string]string, error) {
	objs, err := Load()
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		d, ok := o.Value.(*appsv1.Deployment)
		if !ok {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name != "epp" {
				continue
			}
			m := map[string]string{}
			for _, f := range PickerMetricFlags {
				v, ok := Flag(c.Args, f)
				if !ok {
					return nil, fmt.Errorf("%s: epp container has no --%s", o.File, f)
				}
				m[f] = v
			}
			return m, nil
		}
	}
	return nil, fmt.Errorf("no Deployment with an epp container under deploy/k8s")
}
