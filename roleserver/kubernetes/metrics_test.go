package kubernetes

import (
	"encoding/base64"
	"encoding/json"
	"net"
	"slices"
	"strconv"
	"testing"

	"plinth.dev/plinth/platform/layout"
)

// TestMetricsWiring: the metrics server checks kubelets against their
// serving CA and serves on its port with its own certificate; the API
// server routes to endpoints; the APIService trusts the CA handed in and
// names the Service; the Service's port and each controller's
// EndpointSlice agree on the port's name, the slice names the Service
// and says ready or not.
func TestMetricsWiring(t *testing.T) {
	f := map[string]string{}
	for _, n := range []string{fileCA, fileFrontProxyCA, fileKubeletServingCA, fileMetricsServer, fileMetricsServing, fileMetricsServingKey} {
		f[n] = "/x/" + n
	}
	args := metricsServerArgs(f)
	for _, want := range []string{"--secure-port=" + strconv.Itoa(layout.MetricsServerPort), "--kubelet-certificate-authority=/x/kubelet-serving-ca.pem",
		"--tls-cert-file=/x/metrics-serving.pem", "--kubeconfig=/x/metrics-server.kubeconfig", "--requestheader-client-ca-file=/x/front-proxy-ca.pem",
		"--client-ca-file=/x/ca.pem", "--kubelet-preferred-address-types=InternalIP"} {
		if !slices.Contains(args, want) {
			t.Errorf("metrics-server args lack %s: %v", want, args)
		}
	}
	if args[0] != "metrics-server" {
		t.Errorf("component %q", args[0])
	}
	if api := apiserverArgs(f, net.ParseIP("10.42.0.10"), "/e/etcd.sock"); !slices.Contains(api, "--enable-aggregator-routing=true") {
		t.Errorf("the API server does not route to the metrics servers' endpoints: %v", api)
	}

	var svc struct {
		Metadata struct{ Name, Namespace string }
		Spec     struct {
			Selector map[string]string
			Ports    []struct {
				Name       string
				Port       int
				TargetPort int `json:"targetPort"`
			}
		}
	}
	var apiService struct {
		Spec struct {
			Group, Version string
			Service        struct {
				Namespace, Name string
				Port            int
			}
			CABundle string `json:"caBundle"`
		}
	}
	objs := metricsAPIObjects([]byte("CA PEM"))
	if len(objs) != 2 {
		t.Fatalf("%d objects, want the Service and the APIService", len(objs))
	}
	for i, into := range []any{&svc, &apiService} {
		if err := json.Unmarshal([]byte(objs[i].body), into); err != nil {
			t.Fatalf("%s: %v", objs[i].path, err)
		}
	}
	if svc.Spec.Selector != nil || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != layout.MetricsServerPort {
		t.Errorf("Service %+v: want no selector, one port to %d", svc, layout.MetricsServerPort)
	}
	ca, _ := base64.StdEncoding.DecodeString(apiService.Spec.CABundle)
	if s := apiService.Spec; string(ca) != "CA PEM" || s.Group != "metrics.k8s.io" || s.Version != "v1beta1" ||
		s.Service.Namespace != svc.Metadata.Namespace || s.Service.Name != svc.Metadata.Name || s.Service.Port != svc.Spec.Ports[0].Port {
		t.Errorf("APIService %+v (CA %q) does not name the Service %+v and the CA", s, ca, svc)
	}

	for _, ready := range []bool{true, false} {
		var slice struct {
			Metadata struct {
				Name   string
				Labels map[string]string
			}
			Endpoints []struct {
				Addresses  []string
				Conditions struct{ Ready *bool }
			}
			Ports []struct {
				Name string
				Port int
			}
		}
		o := metricsEndpoint("plinth-0123", net.IPv4(10, 42, 0, 10), ready)
		if err := json.Unmarshal([]byte(o.body), &slice); err != nil {
			t.Fatal(err)
		}
		if slice.Metadata.Labels["kubernetes.io/service-name"] != svc.Metadata.Name || slice.Metadata.Name != "metrics-server-plinth-0123" ||
			o.path != metricsSlicePath("plinth-0123") || len(slice.Endpoints) != 1 || slice.Endpoints[0].Addresses[0] != "10.42.0.10" ||
			slice.Endpoints[0].Conditions.Ready == nil || *slice.Endpoints[0].Conditions.Ready != ready ||
			len(slice.Ports) != 1 || slice.Ports[0].Name != svc.Spec.Ports[0].Name || slice.Ports[0].Port != layout.MetricsServerPort {
			t.Errorf("EndpointSlice (ready %v) %+v at %s", ready, slice, o.path)
		}
	}
}
