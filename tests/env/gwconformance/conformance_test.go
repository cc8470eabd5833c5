// The official Gateway API conformance suite, unmodified: this file only calls it. Its flags
// (gateway class, supported features, profiles, report) come from `make conformance`.
package gwconformance

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
