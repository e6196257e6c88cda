// CoreDNS with the plugins the test cluster's DNS uses, built the way CoreDNS documents
// for a chosen plugin set: coremain plus the plugins' packages (each registers itself).
// e2e/cluster.sh builds it from the Go module proxy into $ASYNCD_CACHE/coredns-<version>.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
