package kubenode

import (
	"fmt"
	"os"
	"sync"
)

// Tap is a LAN port for a node this package does not run: a virtual
// machine's tap device on the LAN's bridge (lab/vmnode's guest). It holds a
// node slot, so its addresses are a node's and never collide with one: IP
// 10.215.<Index>.2 on the LAN, pods in PodCIDR 10.214.<Index>.0/24, routed
// from the LAN and from the host as a Node's are. The guest configures its
// own end: IP/16 on its NIC, the other nodes' pods and the host's Uplinks
// via Gateway, and a dead-end default route.
type Tap struct {
	// Index is the node slot the tap holds.
	Index int
	// Name is the tap device in the LAN's namespace: the process that opens
	// it (qemu's tap netdev) must run in NetNS.
	Name, NetNS string
	// IP and PodCIDR are the guest's; Gateway is LANGateway, where the API
	// server is relayed (port APIServerPort).
	IP, PodCIDR, Gateway string

	lan      *LAN
	lock     *os.File
	stopOnce sync.Once
}

// AddTap takes a free node slot and creates its port on the LAN: a tap
// device on the bridge, the LAN's route to the slot's pod range, and the
// host's routes to its address and pods. Remove undoes it; if the process
// dies first, the LAN's teardown removes the tap, the routes and (with the
// process) the slot's lock.
func (l *LAN) AddTap() (_ *Tap, err error) {
	i, f, err := lockSlot()
	if err != nil {
		return nil, err
	}
	t := &Tap{lan: l, NetNS: l.NetNS, Gateway: LANGateway, Index: i, lock: f}
	t.Name = port(t.Index)
	t.IP = fmt.Sprintf("10.215.%d.2", t.Index)
	t.PodCIDR = fmt.Sprintf("10.214.%d.0/24", t.Index)
	defer func() {
		if err != nil {
			t.Remove()
		}
	}()
	_ = l.in("ip", "link", "del", t.Name) // of an earlier node in this slot
	for _, s := range [][]string{
		{"ip", "tuntap", "add", "dev", t.Name, "mode", "tap"},
		{"ip", "link", "set", t.Name, "master", "br0"},
		{"ip", "link", "set", t.Name, "up"},
		{"ip", "route", "replace", t.PodCIDR, "via", t.IP, "dev", "br0"},
	} {
		if err := l.in(s...); err != nil {
			return nil, fmt.Errorf("tap for node slot %d on LAN %d: %w", t.Index, l.Index, err)
		}
	}
	for _, r := range l.routesTo(t.IP, t.PodCIDR) {
		if err := run("ip", append([]string{"route", "replace"}, r...)...); err != nil {
			return nil, fmt.Errorf("tap for node slot %d on LAN %d: %w", t.Index, l.Index, err)
		}
	}
	return t, nil
}

// Remove deletes the tap and its routes and frees the slot. The guest must
// be gone (a tap still open by qemu is deleted with it).
func (t *Tap) Remove() {
	t.stopOnce.Do(func() {
		for _, r := range t.lan.routesTo(t.IP, t.PodCIDR) {
			_ = run("ip", append([]string{"route", "del"}, r[0])...)
		}
		_ = t.lan.in("ip", "route", "del", t.PodCIDR)
		_ = t.lan.in("ip", "link", "del", t.Name)
		if t.lock != nil {
			t.lock.Close()
		}
	})
}
