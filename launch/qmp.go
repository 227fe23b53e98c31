package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"plinth.dev/plinth/platform/supervisor"
)

// qmpConnectTimeout covers the window right after exec in which QEMU has
// not created its QMP socket yet.
const qmpConnectTimeout = 5 * time.Second

// qmpMessage is any message QEMU sends: the greeting, an event or a reply.
type qmpMessage struct {
	QMP    json.RawMessage `json:"QMP"`
	Event  string          `json:"event"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

type qmpKey struct {
	Type string `json:"type"`
	Data string `json:"data"`
}

// PowerDown presses the ACPI power button; whether and how fast the guest
// reacts is up to the guest.
func (n *Node) PowerDown(ctx context.Context) error {
	_, err := n.QMP(ctx, "system_powerdown", nil)
	return err
}

// CtrlAltDel sends the key chord to the guest's keyboard, which is how a
// console user asks init for a reboot (and, with -no-reboot, QEMU then exits).
func (n *Node) CtrlAltDel(ctx context.Context) error {
	keys := []qmpKey{{"qcode", "ctrl"}, {"qcode", "alt"}, {"qcode", "delete"}}
	_, err := n.QMP(ctx, "send-key", map[string]any{"keys": keys})
	return err
}

// QMP runs one command on a fresh connection. QEMU's QMP socket serves one
// client at a time, so holding a connection open would block anyone else
// (e.g. a developer poking at a `make run` node with socat); calls are
// serialised so our own commands never queue behind each other.
func (n *Node) QMP(ctx context.Context, command string, args any) (json.RawMessage, error) {
	n.qmpMu.Lock()
	defer n.qmpMu.Unlock()
	ret, err := n.qmpLocked(ctx, command, args)
	if err != nil {
		return nil, fmt.Errorf("node %s: qmp %s: %w", n.opts.Name, command, err)
	}
	return ret, nil
}

func (n *Node) qmpLocked(ctx context.Context, command string, args any) (json.RawMessage, error) {
	conn, err := n.qmpDial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// Tie the whole exchange to ctx: a wedged QEMU must not hang the test.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}

	dec := json.NewDecoder(conn)
	enc := json.NewEncoder(conn)
	var greeting qmpMessage
	if err := dec.Decode(&greeting); err != nil {
		return nil, ctxErr(ctx, fmt.Errorf("reading greeting: %w", err))
	}
	if greeting.QMP == nil {
		return nil, errors.New("unexpected greeting (not a QMP socket?)")
	}
	if _, err := qmpExec(ctx, dec, enc, "qmp_capabilities", nil); err != nil {
		return nil, err
	}
	return qmpExec(ctx, dec, enc, command, args)
}

// qmpExec sends one command and returns its reply, skipping the events
// that QEMU interleaves freely (e.g. POWERDOWN arrives around the return
// of system_powerdown).
func qmpExec(ctx context.Context, dec *json.Decoder, enc *json.Encoder, command string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	if err := enc.Encode(req); err != nil {
		return nil, ctxErr(ctx, err)
	}
	for {
		var m qmpMessage
		if err := dec.Decode(&m); err != nil {
			return nil, ctxErr(ctx, fmt.Errorf("reading reply to %s: %w", command, err))
		}
		switch {
		case m.Error != nil:
			return nil, fmt.Errorf("%s: %s: %s", command, m.Error.Class, m.Error.Desc)
		case m.Return != nil:
			return m.Return, nil
		}
	}
}

// qmpDial retries until QEMU listens. It gives up early if QEMU has exited,
// since the socket will then never answer.
func (n *Node) qmpDial(ctx context.Context) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, qmpConnectTimeout)
	defer cancel()
	var d net.Dialer
	for {
		conn, err := d.DialContext(dctx, "unix", n.qmpPath)
		if err == nil {
			return conn, nil
		}
		select {
		case <-n.exited:
			return nil, fmt.Errorf("%w (%s)", ErrExited, n.ExitStatus())
		default:
		}
		if supervisor.Sleep(dctx, 50*time.Millisecond) != nil {
			return nil, fmt.Errorf("connecting to %s: %w", n.qmpPath, err)
		}
	}
}

// ctxErr prefers the context's error, which explains an I/O error caused
// by the deadline we set from it.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}
