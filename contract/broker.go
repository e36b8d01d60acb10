package contract

import (
	"fmt"
	"net/url"
	"slices"
)

// BrokerSchemes are the URL schemes of a broker the sidecar's MQTT probe
// reaches (paho's): one rule for the sidecar, which refuses another at
// start, and for inject, which refuses it before it reaches a pod.
var BrokerSchemes = []string{"tcp", "mqtt", "ssl", "tls", "ws", "wss"}

// CheckBrokerURL checks an MQTT broker URL: one of BrokerSchemes and a host.
func CheckBrokerURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("broker URL %q: %w", s, err)
	}
	if !slices.Contains(BrokerSchemes, u.Scheme) {
		return fmt.Errorf("broker URL %q: scheme must be one of %v, as in tcp://127.0.0.1:1883", s, BrokerSchemes)
	}
	if u.Host == "" {
		return fmt.Errorf("broker URL %q has no host, as in tcp://127.0.0.1:1883", s)
	}
	return nil
}
