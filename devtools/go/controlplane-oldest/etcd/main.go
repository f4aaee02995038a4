// Command etcd is etcd's own server entry point; go.etcd.io/etcd/server/v3 cannot be
// `go install`ed directly because of its replace directives.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
