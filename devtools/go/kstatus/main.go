// kstatus reads Kubernetes objects (JSON or YAML; one object, a multi-document YAML stream,
// concatenated JSON, or a List with items) from stdin or the files named as arguments and prints,
// per object, one JSON line with its kstatus result (sigs.k8s.io/cli-utils/pkg/kstatus/status):
//
//	{"apiVersion":"…","kind":"…","namespace":"…","name":"…","status":"Current","message":"…"}
//
// Exit status: 0 when every object is Current, 1 when any is not, 2 on bad input.
// With -any-exit0 it always exits 0 after printing; -version prints the cli-utils version.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

// version is the sigs.k8s.io/cli-utils version, stamped with -X by the build (tools.py).
var version = "unknown"

type result struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	Status     string `json:"status"`
	Message    string `json:"message"`
	Error      string `json:"error,omitempty"`
}

func main() {
	exit0 := flag.Bool("any-exit0", false, "exit 0 whatever the statuses are")
	showVersion := flag.Bool("version", false, "print the sigs.k8s.io/cli-utils version")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}

	var inputs []io.Reader
	if flag.NArg() == 0 {
		inputs = append(inputs, os.Stdin)
	}
	for _, path := range flag.Args() {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer f.Close()
		inputs = append(inputs, f)
	}

	out := json.NewEncoder(os.Stdout)
	allCurrent, seen := true, 0
	for _, in := range inputs {
		decoder := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(in), 4096)
		for {
			// Decode to raw JSON first, then with apimachinery's json, which keeps integers as
			// int64: encoding/json's float64 makes kstatus fail on metadata.generation.
			var raw json.RawMessage
			if err := decoder.Decode(&raw); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				fmt.Fprintln(os.Stderr, "bad input:", err)
				os.Exit(2)
			}
			var obj map[string]interface{}
			if err := utiljson.Unmarshal(raw, &obj); err != nil {
				fmt.Fprintln(os.Stderr, "bad input:", err)
				os.Exit(2)
			}
			if obj == nil { // an empty YAML document
				continue
			}
			for _, u := range flatten(&unstructured.Unstructured{Object: obj}) {
				seen++
				r := compute(u)
				if r.Status != string(status.CurrentStatus) {
					allCurrent = false
				}
				_ = out.Encode(r)
			}
		}
	}
	if seen == 0 {
		fmt.Fprintln(os.Stderr, "no objects on input")
		os.Exit(2)
	}
	if !allCurrent && !*exit0 {
		os.Exit(1)
	}
}

// flatten expands a List (kind List or *List with items) into its items.
func flatten(u *unstructured.Unstructured) []*unstructured.Unstructured {
	if !u.IsList() {
		return []*unstructured.Unstructured{u}
	}
	list, err := u.ToList()
	if err != nil {
		return []*unstructured.Unstructured{u}
	}
	var items []*unstructured.Unstructured
	for i := range list.Items {
		items = append(items, flatten(&list.Items[i])...)
	}
	return items
}

func compute(u *unstructured.Unstructured) result {
	r := result{APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName()}
	res, err := status.Compute(u)
	if err != nil {
		r.Status, r.Error = string(status.UnknownStatus), err.Error()
		return r
	}
	r.Status, r.Message = string(res.Status), res.Message
	return r
}
