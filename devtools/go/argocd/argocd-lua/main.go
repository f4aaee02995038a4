// argocd-lua runs Argo CD's resource health checks the way its application-controller does, with
// Argo CD's own code: the argocd-cm ConfigMap named by -cm (YAML, as a user applies it) is read by
// Argo CD's settings manager (util/settings, from an in-memory API server), whose
// `resource.customizations.health.<group>_<Kind>` keys become the overrides that gitops-engine's
// health.GetResourceHealth runs in Argo CD's Lua VM (util/lua: gopher-lua with the restricted
// standard library). Objects (JSON or YAML, a stream of them) come from stdin; per object it
// prints one JSON line:
//
//	{"kind":"…","name":"…","status":"Healthy","message":"…"}
//
// with "error" instead when the check fails, and "status":"" when Argo CD has no check for the
// kind. Exit status: 0 when every object got a status, 1 when any did not, 2 on bad input.
// -version prints the Argo CD version. Built by `make tools` through
// apportion_dev.devcluster.tools into ~/.cache/apportion/argocd-lua-<version>.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/argoproj/argo-cd/v3/common"
	appv1 "github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"github.com/argoproj/argo-cd/v3/util/settings"
	"github.com/argoproj/gitops-engine/pkg/health"
	log "github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"
)

// version is the Argo CD version, stamped with -X by the build (tools.py).
var version = "unknown"

const namespace = "argocd"

type result struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
	Error   string `json:"error,omitempty"`
}

func main() {
	cmPath := flag.String("cm", "", "the argocd-cm ConfigMap (YAML) whose health customizations to load")
	showVersion := flag.Bool("version", false, "print the Argo CD version")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	if *cmPath == "" {
		fail("-cm is required")
	}
	// the settings manager logs at info level; its output is not ours to print
	log.SetLevel(log.WarnLevel)
	overrides, err := loadOverrides(*cmPath)
	if err != nil {
		fail(err.Error())
	}

	out := json.NewEncoder(os.Stdout)
	decoder := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(os.Stdin), 4096)
	allFound, seen := true, 0
	for {
		var raw json.RawMessage
		if err := decoder.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			fail("bad input: " + err.Error())
		}
		// apimachinery's json keeps integers as int64, as the controller's objects have them
		var obj map[string]any
		if err := utiljson.Unmarshal(raw, &obj); err != nil {
			fail("bad input: " + err.Error())
		}
		seen++
		u := &unstructured.Unstructured{Object: obj}
		r := result{Kind: u.GetKind(), Name: u.GetName()}
		// what controller/health.go's setApplicationHealth calls for each live resource
		status, err := health.GetResourceHealth(u, lua.ResourceHealthOverrides(overrides))
		switch {
		case err != nil:
			r.Error, allFound = err.Error(), false
		case status == nil:
			allFound = false
		default:
			r.Status, r.Message = string(status.Status), status.Message
		}
		_ = out.Encode(r)
	}
	if seen == 0 {
		fail("no objects on input")
	}
	if !allFound {
		os.Exit(1)
	}
}

// loadOverrides reads the ConfigMap through Argo CD's settings manager, as the controller reads
// argocd-cm from the cluster (the manager watches ConfigMaps labelled part-of=argocd).
func loadOverrides(path string) (map[string]appv1.ResourceOverride, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{}
	if err := yaml.UnmarshalStrict(text, cm); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if cm.Kind != "ConfigMap" || cm.Name != common.ArgoCDConfigMapName {
		return nil, fmt.Errorf("%s is not the argocd-cm ConfigMap", path)
	}
	cm.Namespace = namespace
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels["app.kubernetes.io/part-of"] = "argocd"
	manager := settings.NewSettingsManager(context.Background(), fake.NewClientset(cm), namespace)
	return manager.GetResourceOverrides()
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, message)
	os.Exit(2)
}
