package deploy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// exitMargin is the least time the grace period must leave after the
// preStop sleep and the drain: the server cancels what is left and exits,
// and a SIGKILL before that loses the final log lines and metrics.
const exitMargin = 5 * time.Second

// serverApp is the pod label every dflash_server replica carries.
const serverApp = "dflash-server"

type set struct {
	deployments  []*appsv1.Deployment
	services     map[string]*corev1.Service
	pools        []*inferencev1.InferencePool
	routes       []*gatewayv1.HTTPRoute
	epp          *appsv1.Deployment
	serverDeploy []*appsv1.Deployment
}

func load(t *testing.T) set {
	t.Helper()
	objs, err := Load()
	if err != nil {
		t.Fatalf("load manifests: %v", err)
	}
	s := set{services: map[string]*corev1.Service{}}
	for _, o := range objs {
		switch v := o.Value.(type) {
		case *appsv1.Deployment:
			s.deployments = append(s.deployments, v)
			if v.Spec.Template.Labels["app.kubernetes.io/name"] == serverApp {
				s.serverDeploy = append(s.serverDeploy, v)
			}
			for _, c := range v.Spec.Template.Spec.Containers {
				if c.Name == "epp" {
					s.epp = v
				}
			}
		case *corev1.Service:
			s.services[v.Name] = v
		case *inferencev1.InferencePool:
			s.pools = append(s.pools, v)
		case *gatewayv1.HTTPRoute:
			s.routes = append(s.routes, v)
		}
	}
	if len(s.serverDeploy) != 2 || len(s.pools) != 1 || len(s.routes) != 1 || s.epp == nil {
		t.Fatalf("manifests: %d server Deployments, %d InferencePools, %d HTTPRoutes, epp %v; want 2, 1, 1, true",
			len(s.serverDeploy), len(s.pools), len(s.routes), s.epp != nil)
	}
	return s
}

// TestDecodeRejectsUnknownFields checks the decoder itself: a misspelt
// field or an unknown kind must fail, or the manifest tests prove nothing.
func TestDecodeRejectsUnknownFields(t *testing.T) {
	tests := []struct {
		name, doc, wantErr string
	}{
		{"misspelt field", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {a: b}}\n", "unknown field"},
		{"misspelt nested field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {terminationGracePeriod: 3}}}\n", "unknown field"},
		{"route field", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: x}\nspec: {rules: [{backendRef: []}]}\n", "unknown field"},
		{"pool field", "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: x}\nspec: {targetPort: [{number: 8000}]}\n", "unknown field"},
		{"pool picker field", "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: x}\nspec: {endpointPickerRef: {name: e, failMode: FailClose}}\n", "unknown field"},
		{"duplicate key", "apiVersion: v1\nkind: Service\nkind: Service\n", "already set"},
		{"unknown kind", "apiVersion: v1\nkind: Sevrice\n", "no API type"},
		{"valid", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selector: {a: b}}\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			_, err := decode([]byte(tt.doc))
			if tt.wantErr == "" {
				is.NoErr(err)
				return
			}
			is.True(err != nil)
			is.True(strings.Contains(err.Error(), tt.wantErr)) // error names the cause
		})
	}
}

func TestManifestsDecode(t *testing.T) {
	is := is.New(t)
	objs, err := Load()
	is.NoErr(err)
	files := map[string]bool{}
	for _, o := range objs {
		files[o.File] = true
	}
	for _, f := range []string{"deployment.yaml", "deployment-2gpu.yaml", "service.yaml", "inferencepool.yaml", "httproute.yaml", "epp.yaml"} {
		is.True(files["deploy/k8s/"+f]) // every manifest decodes at least one object
	}
}

// TestServerDeployments checks each replica Deployment: probes on the
// server's endpoints, GPUs matching the placement in its args, and a grace
// period that covers the preStop sleep plus --drain-timeout.
func TestServerDeployments(t *testing.T) {
	s := load(t)
	for _, d := range s.serverDeploy {
		t.Run(d.Name, func(t *testing.T) {
			is := is.New(t)
			pod := d.Spec.Template.Spec
			is.Equal(len(pod.Containers), 1)
			c := pod.Containers[0]
			is.True(labels.SelectorFromSet(d.Spec.Selector.MatchLabels).Matches(labels.Set(d.Spec.Template.Labels)))

			is.True(c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil)
			is.Equal(c.ReadinessProbe.HTTPGet.Path, "/ready")
			is.True(c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil)
			is.Equal(c.LivenessProbe.HTTPGet.Path, "/health")

			port, ok := Flag(c.Args, "port")
			is.True(ok)
			is.Equal(port, fmt.Sprint(containerPort(c, "http")))

			drainArg, ok := Flag(c.Args, "drain-timeout")
			is.True(ok) // the drain is explicit, not the flag's default
			drain, err := time.ParseDuration(drainArg)
			is.NoErr(err)
			is.True(c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil)
			sleep := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
			is.True(pod.TerminationGracePeriodSeconds != nil)
			grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
			if grace < sleep+drain+exitMargin {
				t.Errorf("terminationGracePeriodSeconds %s < preStop %s + --drain-timeout %s + %s", grace, sleep, drain, exitMargin)
			}

			gpus := map[string]bool{}
			for i, a := range c.Args {
				v, ok := strings.CutPrefix(a, "--target-device=")
				if !ok && a == "--target-device" && i+1 < len(c.Args) {
					v, ok = c.Args[i+1], true
				}
				if ok && strings.HasPrefix(v, "cuda:") {
					gpus[v] = true
				}
			}
			limit := c.Resources.Limits[corev1.ResourceName("nvidia.com/gpu")]
			is.Equal(limit.Value(), int64(len(gpus))) // one GPU per distinct cuda:N
			is.True(len(gpus) > 0)
		})
	}
}

// TestCrossReferences checks that the objects name each other correctly:
// Service and InferencePool select the replicas' pods on the server's port,
// the pool's picker is the epp Service, and the route sends to the pool.
func TestCrossReferences(t *testing.T) {
	s := load(t)
	pool := s.pools[0]
	poolSel := map[string]string{}
	for k, v := range pool.Spec.Selector.MatchLabels {
		poolSel[string(k)] = string(v)
	}
	if len(poolSel) == 0 || len(pool.Spec.TargetPorts) != 1 || pool.Spec.EndpointPickerRef == nil || pool.Spec.EndpointPickerRef.Port == nil {
		t.Fatalf("InferencePool spec: want matchLabels, one target port and an endpoint picker with a port, got %+v", pool.Spec)
	}
	poolPort := int64(pool.Spec.TargetPorts[0].Number)
	pickerName := string(pool.Spec.EndpointPickerRef.Name)
	pickerPort := int64(pool.Spec.EndpointPickerRef.Port.Number)

	tests := []struct {
		name  string
		check func(is *is.I)
	}{
		{"service selects the replicas", func(is *is.I) {
			svc := s.services[serverApp]
			is.True(svc != nil)
			for _, d := range s.serverDeploy {
				is.True(labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)))
				is.Equal(svc.Spec.Ports[0].TargetPort.String(), "http")
				is.True(containerPort(d.Spec.Template.Spec.Containers[0], "http") != 0)
			}
		}},
		{"pool selects the replicas on the server port", func(is *is.I) {
			is.Equal(pool.APIVersion, InferencePoolAPIVersion)
			for _, d := range s.serverDeploy {
				is.True(labels.SelectorFromSet(poolSel).Matches(labels.Set(d.Spec.Template.Labels)))
				is.Equal(poolPort, int64(containerPort(d.Spec.Template.Spec.Containers[0], "http")))
			}
			// The picker must not be one of the model servers it scores.
			is.True(!labels.SelectorFromSet(poolSel).Matches(labels.Set(s.epp.Spec.Template.Labels)))
		}},
		{"pool's picker is the epp service", func(is *is.I) {
			svc := s.services[pickerName]
			is.True(svc != nil)
			is.True(labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(s.epp.Spec.Template.Labels)))
			found := false
			for _, p := range svc.Spec.Ports {
				found = found || int64(p.Port) == pickerPort
			}
			is.True(found) // endpointPickerRef.port is a port of the epp Service
			args := s.epp.Spec.Template.Spec.Containers[0].Args
			name, _ := Flag(args, "pool-name")
			is.Equal(name, pool.Name)
			grpc, _ := Flag(args, "grpc-port")
			is.Equal(grpc, fmt.Sprint(pickerPort))
		}},
		{"route sends to the pool", func(is *is.I) {
			refs := 0
			for _, r := range s.routes[0].Spec.Rules {
				for _, b := range r.BackendRefs {
					refs++
					is.True(b.Group != nil && string(*b.Group) == "inference.networking.k8s.io")
					is.True(b.Kind != nil && string(*b.Kind) == "InferencePool")
					is.Equal(string(b.Name), pool.Name)
				}
			}
			is.True(refs > 0)
		}},
		{"picker reads our gauges", func(is *is.I) {
			m, err := PickerMetrics()
			is.NoErr(err)
			is.Equal(m["total-queued-requests-metric"], "dflash_requests_waiting")
			is.Equal(m["total-running-requests-metric"], "dflash_requests_running")
			is.Equal(m["kv-cache-usage-percentage-metric"], "dflash_kv_cache_usage_ratio")
			is.Equal(m["lora-info-metric"], "") // no adapters: the signal is off
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(is.New(t)) })
	}
}

func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}
