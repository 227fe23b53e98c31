package console

import "golang.org/x/sys/unix"

// noCTTY: opening a console must not make it the core's controlling
// terminal (a Ctrl-C there would then signal the node).
const noCTTY = unix.O_NOCTTY
