package agent

import (
	"strings"
	"testing"
	"time"
)

// TestValidateAcceptsWhatNewDefaultsAndNamesEachSettingItRefuses: a zero
// value New would default passes; each bad value is refused with its
// setting's name, by Validate and by New alike.
func TestValidateAcceptsWhatNewDefaultsAndNamesEachSettingItRefuses(t *testing.T) {
	auth := staticTokens(t, tokenA+" "+podA.String())
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string // in the error; "" passes
	}{
		{"zero values take the defaults", func(*Config) {}, ""},
		{"amf-agent's defaults", func(c *Config) {
			c.MaxClients, c.MaxPending, c.MaxPendingPerSource = 256, 256, 8
			c.MaxKeepalive, c.ConnectTimeout = time.Minute, 3*time.Second
		}, ""},
		{"the longest MQTT keepalive", func(c *Config) { c.MaxKeepalive = 65535 * time.Second }, ""},
		{"no authenticator", func(c *Config) { c.Authenticator = nil }, "Config.Authenticator is required"},
		{"no session", func(c *Config) { c.MaxClients = -1 }, "MaxClients -1"},
		{"no pending connection", func(c *Config) { c.MaxPending = -1 }, "MaxPending -1"},
		{"no pending connection per source", func(c *Config) { c.MaxPendingPerSource = -2 }, "MaxPendingPerSource -2"},
		{"a keepalive under a second", func(c *Config) { c.MaxKeepalive = 500 * time.Millisecond }, "MaxKeepalive 500ms"},
		{"a keepalive MQTT cannot say", func(c *Config) { c.MaxKeepalive = 65536 * time.Second }, "MaxKeepalive 18h12m16s"},
		{"a negative connect timeout", func(c *Config) { c.ConnectTimeout = -time.Second }, "negative timeout, history length or retention: ConnectTimeout -1s"},
		{"a negative token check timeout", func(c *Config) { c.AuthTimeout = -time.Second }, "AuthTimeout -1s"},
		{"a negative history", func(c *Config) { c.HistoryLen = -1 }, "HistoryLen -1"},
		{"a negative retention", func(c *Config) { c.Retention = -time.Minute }, "Retention -1m0s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{MQTTAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authenticator: auth}
			tt.edit(&cfg)
			err := cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
			if _, nerr := New(cfg); (nerr == nil) != (err == nil) {
				t.Errorf("New: %v, Validate: %v; want both to pass or both to refuse", nerr, err)
			}
		})
	}
}
