//go:build tools

// Package tools pins Istio's binaries that the differential tests run beside ours.
// Nothing here is compiled into the product; scripts/build-istio builds these package paths.
package tools

import (
	_ "istio.io/istio/cni/cmd/install-cni"
	_ "istio.io/istio/cni/cmd/istio-cni"
	_ "istio.io/istio/pilot/cmd/pilot-agent"
)
