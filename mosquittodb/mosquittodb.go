// Package mosquittodb reads Mosquitto's persistence file (mosquitto.db),
// formats 5 and 6 (Mosquitto 1.6 to 2.0): enough to tell a whole file from a
// torn or foreign one before it is handed to a standby, and to count what
// it carries — retained messages, persistent sessions, their subscriptions
// and their queued and in-flight messages — so that a handover can say what
// it moved (DESIGN.md, "Broker state").
//
// The file is Mosquitto's own and stays opaque: it is moved whole, never
// rewritten. The layout is Mosquitto's src/persist.h: a 15-byte magic, a
// CRC field (written as 0), the format version, then chunks, each a type
// and a length (both 32-bit, network order) and that many bytes.
package mosquittodb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Chunk types (src/persist.h).
const (
	chunkCfg       = 1
	chunkMsgStore  = 2
	chunkClientMsg = 3
	chunkRetain    = 4
	chunkSub       = 5
	chunkClient    = 6
)

// Fixed parts of the chunks read here (struct PF_* of src/persist.h).
const (
	cfgShutdown    = 8  // PF_cfg: uint64 last_db_id, then uint8 shutdown
	cfgSize        = 10 // up to and with dbid_size
	clientIDLen    = 14 // PF_client: int64 expiry time, uint32 interval, uint16 last_mid, then uint16 id_len
	clientFixed    = 24 // sizeof(struct PF_client), padding included
	clientMsgDir   = 15 // PF_client_msg: dbid_t, uint16 mid, uint16 id_len, uint8 qos, state, retain_dup, then direction
	clientMsgFixed = 16
	directionOut   = 1 // mosq_md_out: towards the client
	headerSize     = 8
)

var magic = []byte{0x00, 0xB5, 0x00, 'm', 'o', 's', 'q', 'u', 'i', 't', 't', 'o', ' ', 'd', 'b'}

// ErrFormat is wrapped by every refusal of Read.
var ErrFormat = errors.New("mosquittodb: not a whole Mosquitto persistence file")

// Summary is what one file holds.
type Summary struct {
	Version int
	// Shutdown: the file was written as the broker stopped, so nothing
	// happened in that broker after it (PF_cfg.shutdown).
	Shutdown bool
	// Sessions are the client IDs of the persistent sessions (clean start
	// 0, or a session expiry), in file order; bridges' sessions included.
	Sessions      []string
	Subscriptions int // of those sessions
	Retained      int // retained messages
	Stored        int // messages in the store (retained, queued or in flight)
	Queued        int // messages queued or in flight towards clients
	Incoming      int // QoS 2 messages received from clients and not yet released
	Bytes         int
}

// Read checks b and summarises it. A file with a bad magic, an unknown
// version, or a chunk that runs past the end is refused: Mosquitto renames
// a finished file into place, so a reader never sees a torn one, and
// anything else is not a file to hand to a standby.
func Read(b []byte) (Summary, error) {
	s := Summary{Bytes: len(b)}
	if len(b) < len(magic)+8 || !bytes.Equal(b[:len(magic)], magic) {
		return s, fmt.Errorf("%w: no Mosquitto header in its first %d bytes", ErrFormat, len(magic))
	}
	s.Version = int(binary.BigEndian.Uint32(b[len(magic)+4:]))
	if s.Version != 5 && s.Version != 6 {
		return s, fmt.Errorf("%w: format version %d (this reads 5 and 6: Mosquitto 1.6 to 2.0)", ErrFormat, s.Version)
	}
	cfg := false
	for off := len(magic) + 8; off < len(b); {
		if len(b)-off < headerSize {
			return s, fmt.Errorf("%w: %d stray bytes at byte %d", ErrFormat, len(b)-off, off)
		}
		typ := binary.BigEndian.Uint32(b[off:])
		n := int64(binary.BigEndian.Uint32(b[off+4:]))
		body := off + headerSize
		if n > int64(len(b)-body) {
			return s, fmt.Errorf("%w: chunk of type %d at byte %d is %d bytes long, past the end (%d bytes)", ErrFormat, typ, off, n, len(b))
		}
		c := b[body : body+int(n)]
		short := func(want int) error {
			return fmt.Errorf("%w: chunk of type %d at byte %d is %d bytes, shorter than its fixed part (%d)", ErrFormat, typ, off, n, want)
		}
		switch typ {
		case chunkCfg:
			if len(c) < cfgSize {
				return s, short(cfgSize)
			}
			cfg = true
			s.Shutdown = c[cfgShutdown] != 0
		case chunkClient:
			if len(c) < clientFixed {
				return s, short(clientFixed)
			}
			idLen := int(binary.BigEndian.Uint16(c[clientIDLen:]))
			if idLen == 0 || idLen > len(c)-clientFixed {
				return s, fmt.Errorf("%w: session at byte %d has a client ID of %d bytes in a chunk of %d", ErrFormat, off, idLen, n)
			}
			s.Sessions = append(s.Sessions, string(c[clientFixed:clientFixed+idLen]))
		case chunkClientMsg:
			if len(c) < clientMsgFixed {
				return s, short(clientMsgFixed)
			}
			if c[clientMsgDir] == directionOut {
				s.Queued++
			} else {
				s.Incoming++
			}
		case chunkMsgStore:
			s.Stored++
		case chunkRetain:
			s.Retained++
		case chunkSub:
			s.Subscriptions++
		}
		// Other types are a newer Mosquitto's: skipped, as its reader would.
		off = body + int(n)
	}
	if !cfg {
		return s, fmt.Errorf("%w: no configuration chunk (Mosquitto writes it first)", ErrFormat)
	}
	return s, nil
}
