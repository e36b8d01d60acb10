package podsignal

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func validCommand() Command {
	return Command{Version: Version, Namespace: "edge", Pod: "broker-a-0", Fence: true,
		Time: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), Reason: "cut off from the API server and every guard"}
}

func TestCommandRoundTrips(t *testing.T) {
	for _, fence := range []bool{true, false} {
		c := validCommand()
		c.Fence = fence
		b, err := EncodeCommand(&c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeCommand(CommandTopic(c.Namespace, c.Pod), b)
		if err != nil {
			t.Fatal(err)
		}
		if got != c {
			t.Errorf("got %+v, want %+v", got, c)
		}
	}
}

func TestDecodeCommandRefusesWhatTheContractDoesNot(t *testing.T) {
	topic := CommandTopic("edge", "broker-a-0")
	for _, tc := range []struct {
		name, topic, payload string
	}{
		{"a health topic", Topic("edge", "broker-a-0"), `{"v":1,"namespace":"edge","pod":"broker-a-0","fence":true,"time":"2026-12-01T00:00:00Z"}`},
		{"another pod's topic", CommandTopic("edge", "broker-b-0"), `{"v":1,"namespace":"edge","pod":"broker-a-0","fence":true,"time":"2026-12-01T00:00:00Z"}`},
		{"no fence field", topic, `{"v":1,"namespace":"edge","pod":"broker-a-0","time":"2026-12-01T00:00:00Z"}`},
		{"an unknown field", topic, `{"v":1,"namespace":"edge","pod":"broker-a-0","fence":true,"time":"2026-12-01T00:00:00Z","kill":true}`},
		{"another version", topic, `{"v":2,"namespace":"edge","pod":"broker-a-0","fence":true,"time":"2026-12-01T00:00:00Z"}`},
		{"trailing data", topic, `{"v":1,"namespace":"edge","pod":"broker-a-0","fence":true,"time":"2026-12-01T00:00:00Z"}{}`},
		{"a bad pod name", CommandTopic("edge", "Broker"), `{"v":1,"namespace":"edge","pod":"Broker","fence":true,"time":"2026-12-01T00:00:00Z"}`},
		{"oversize", topic, `{"v":1,"reason":"` + strings.Repeat("x", MaxCommandBytes) + `"}`},
		{"not JSON", topic, `fence`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeCommand(tc.topic, []byte(tc.payload)); !errors.Is(err, ErrCommand) {
				t.Errorf("got %v, want an ErrCommand", err)
			}
		})
	}
}

func FuzzDecodeCommand(f *testing.F) {
	c := validCommand()
	b, _ := EncodeCommand(&c)
	f.Add(CommandTopic(c.Namespace, c.Pod), b)
	f.Add("amf/v1/a/b/command", []byte(`{"v":1,"namespace":"a","pod":"b","fence":false,"time":"2026-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		got, err := DecodeCommand(topic, payload)
		if err != nil {
			return
		}
		b, err := EncodeCommand(&got)
		if err != nil {
			t.Fatalf("accepted command does not re-encode: %v", err)
		}
		if again, err := DecodeCommand(topic, b); err != nil || again != got {
			t.Fatalf("re-encoded command: %+v, %v; want %+v", again, err, got)
		}
	})
}
