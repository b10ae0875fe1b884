// Command etcd runs etcd's own server entry point, built from go.etcd.io/etcd/server/v3 so that
// the test control plane needs no prebuilt etcd binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
