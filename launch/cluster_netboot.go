package launch

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/image"
	"plinth.dev/plinth/roleserver/parameters"
)

// UEFI network boot of cluster nodes (ClusterOptions.NetBoot):
//
//	node (OVMF, PXE off) ── DHCP ──► switch: address + boot file http://NET.4/plinth.efi
//	node ── HTTP GET ──► NET.4:80 ── router (slirp guestfwd) ──► harness HTTP server on 127.0.0.1
//	                                                              serves the cluster's UKI
//
// The UKI is the image's plinth.efi with the cluster's register
// parameters in its measured command line (image.NetbootUKI, what
// `plinthctl build --params` makes), built by AddNode(NetBoot()) once the
// cluster can hand out a ticket. Firmware measures it as it measures a
// disk boot.

// netbootServer serves the cluster's network-boot UKI.
type netbootServer struct {
	srv  *http.Server
	host string // 127.0.0.1:P
	mu   sync.Mutex
	file string // the UKI served, "" until AddNode(NetBoot()) built it
}

// netbootPath is the URL path of the UKI.
const netbootPath = "/plinth.efi"

// netbootGuest is the address nodes fetch the UKI from: the fourth of the
// switch network (.1 is the switch, .3 slirp's DNS, nodes from .10).
func netbootGuest(subnet netip.Prefix) netip.AddrPort {
	a := subnet.Masked().Addr()
	for range 4 {
		a = a.Next()
	}
	return netip.AddrPortFrom(a, 80)
}

func startNetbootServer() (*netbootServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("launch: netboot server: %w", err)
	}
	s := &netbootServer{host: ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc(netbootPath, func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		f := s.file
		s.mu.Unlock()
		if f == "" {
			http.NotFound(w, r)
			return
		}
		http.ServeFile(w, r, f)
	})
	s.srv = &http.Server{Handler: mux}
	go s.srv.Serve(ln)
	return s, nil
}

func (s *netbootServer) serve(file string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.file = file
}

func (s *netbootServer) close() error {
	if s == nil {
		return nil
	}
	return s.srv.Close()
}

// setUpNetboot starts the HTTP server and points the switch's DHCP at it;
// the router gets the returned forward.
func (c *Cluster) setUpNetboot() ([]GuestForward, error) {
	if !c.opts.NetBoot {
		return nil, nil
	}
	s, err := startNetbootServer()
	if err != nil {
		return nil, err
	}
	c.netboot = s
	guest := netbootGuest(c.Switch.Subnet())
	c.Switch.SetBootFile(fmt.Sprintf("http://%s%s", guest.Addr(), netbootPath))
	return []GuestForward{{Guest: guest, Host: s.host}}, nil
}

// NetBoot makes AddNode boot the node through UEFI HTTP boot of the
// cluster's network-boot UKI, with a blank data disk and no parameters of
// its own (ClusterOptions.NetBoot is required).
func NetBoot() AddNodeOption {
	return func(o *addNodeOptions) { o.netboot = true }
}

// buildNetbootUKI makes the cluster's network-boot UKI with reg and serves it.
func (c *Cluster) buildNetbootUKI(reg *nodepb.Register) error {
	if c.netboot == nil {
		return errors.New("launch: NetBoot needs ClusterOptions.NetBoot")
	}
	raw, err := parameters.Encode(&nodepb.Parameters{Cluster: &nodepb.Parameters_Register{Register: reg}})
	if err != nil {
		return err
	}
	out := filepath.Join(c.opts.Dir, "netboot.efi")
	info, err := image.NetbootUKI(c.opts.Image.Dir, "", raw, out)
	if err != nil {
		return err
	}
	c.netboot.serve(out)
	c.logf("network-boot UKI with the register parameters: %s (PCR 11 %s…)", out, info.PCR11[:16])
	return nil
}

// netbootOptions are the QEMU options of a network-booted node: OVMF with
// its own variable store, PXE off (OVMF would try PXE over IPv4 and IPv6
// before HTTP and wait for TFTP), the blank data disk.
func (c *Cluster) netbootOptions(n *ClusterNode) NodeOptions {
	return NodeOptions{
		Name:      n.Name,
		MemoryMiB: c.opts.Image.Board.QEMU.MemoryMiB,
		CPUs:      c.opts.Image.Board.QEMU.CPUs,
		UEFI:      &UEFI{Vars: filepath.Join(n.Dir, "OVMF_VARS.fd")},
		ExtraArgs: []string{
			"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n",
			"-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n",
		},
	}
}
