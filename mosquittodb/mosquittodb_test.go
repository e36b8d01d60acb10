package mosquittodb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
)

// file builds a persistence file of format version with the given chunks.
func file(version uint32, chunks ...[]byte) []byte {
	b := append([]byte(nil), magic...)
	b = binary.BigEndian.AppendUint32(b, 0) // CRC, written as 0
	b = binary.BigEndian.AppendUint32(b, version)
	for _, c := range chunks {
		b = append(b, c...)
	}
	return b
}

func chunk(typ uint32, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

func cfg(shutdown bool) []byte {
	body := make([]byte, 16)
	if shutdown {
		body[cfgShutdown] = 1
	}
	body[cfgShutdown+1] = 8 // dbid_size
	return chunk(chunkCfg, body)
}

func client(id string) []byte {
	body := make([]byte, clientFixed)
	binary.BigEndian.PutUint16(body[clientIDLen:], uint16(len(id)))
	return chunk(chunkClient, append(body, id...))
}

func clientMsg(direction byte) []byte {
	body := make([]byte, clientMsgFixed+2)
	body[clientMsgDir] = direction
	return chunk(chunkClientMsg, body)
}

func TestReadCountsWhatTheFileHolds(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []byte
		want Summary
	}{
		{"empty broker, autosaved", file(6, cfg(false)), Summary{Version: 6}},
		{"written as it stopped", file(6, cfg(true)), Summary{Version: 6, Shutdown: true}},
		{"format 5 (Mosquitto 1.6)", file(5, cfg(false), chunk(chunkRetain, make([]byte, 8))), Summary{Version: 5, Retained: 1}},
		{"sessions, queues, retained", file(6, cfg(true),
			chunk(chunkMsgStore, make([]byte, 40)), chunk(chunkMsgStore, make([]byte, 40)),
			client("sensor-1"), clientMsg(directionOut), clientMsg(directionOut), clientMsg(0),
			client("dashboard"), chunk(chunkSub, make([]byte, 20)), chunk(chunkSub, make([]byte, 20)),
			chunk(chunkRetain, make([]byte, 8))),
			Summary{Version: 6, Shutdown: true, Sessions: []string{"sensor-1", "dashboard"}, Subscriptions: 2, Retained: 1, Stored: 2, Queued: 2, Incoming: 1}},
		{"a newer Mosquitto's chunk is skipped", file(6, cfg(false), chunk(99, []byte("future")), chunk(chunkRetain, make([]byte, 8))),
			Summary{Version: 6, Retained: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Read(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			tt.want.Bytes = len(tt.in)
			if got.Version != tt.want.Version || got.Shutdown != tt.want.Shutdown || !slices.Equal(got.Sessions, tt.want.Sessions) ||
				got.Subscriptions != tt.want.Subscriptions || got.Retained != tt.want.Retained || got.Stored != tt.want.Stored ||
				got.Queued != tt.want.Queued || got.Incoming != tt.want.Incoming || got.Bytes != tt.want.Bytes {
				t.Errorf("Read = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestReadRefusesWhatIsNotAWholeFile(t *testing.T) {
	whole := file(6, cfg(false), client("c"), chunk(chunkRetain, make([]byte, 8)))
	for _, tt := range []struct {
		name, want string
		in         []byte
	}{
		{"nothing", "no Mosquitto header", nil},
		{"another format", "no Mosquitto header", []byte("SQLite format 3\x00 and then some bytes")},
		{"an old version", "format version 4", file(4, cfg(false))},
		{"torn in a chunk", "past the end", whole[:len(whole)-1]},
		{"torn in a header", "stray bytes", whole[:len(whole)-len(chunk(chunkRetain, make([]byte, 8)))+3]},
		{"no configuration", "no configuration chunk", file(6, chunk(chunkRetain, make([]byte, 8)))},
		{"short configuration", "shorter than its fixed part", file(6, chunk(chunkCfg, make([]byte, 4)))},
		{"short session", "shorter than its fixed part", file(6, cfg(false), chunk(chunkClient, make([]byte, 10)))},
		{"session ID past its chunk", "client ID of 200 bytes", file(6, cfg(false), chunk(chunkClient, slices.Concat(binary.BigEndian.AppendUint16(make([]byte, clientIDLen), 200), make([]byte, clientFixed-clientIDLen-2), []byte("abc"))))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(tt.in)
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Read = %v, want ErrFormat saying %q", err, tt.want)
			}
		})
	}
}

// FuzzRead: any bytes give a summary or ErrFormat, never a panic; a file
// accepted has counts no larger than its chunks could hold.
func FuzzRead(f *testing.F) {
	f.Add(file(6, cfg(true), client("a"), clientMsg(directionOut), chunk(chunkRetain, make([]byte, 8))))
	f.Add(file(5, cfg(false)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Read(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		n := len(s.Sessions) + s.Subscriptions + s.Retained + s.Stored + s.Queued + s.Incoming
		if max := (len(b) - len(magic) - 8) / headerSize; n > max {
			t.Fatalf("%d chunks counted in %d bytes", n, len(b))
		}
		for _, id := range s.Sessions {
			if id == "" || !bytes.Contains(b, []byte(id)) {
				t.Fatalf("session %q not in the file", id)
			}
		}
	})
}
