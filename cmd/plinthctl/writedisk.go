package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"plinth.dev/plinth/image"
	"plinth.dev/plinth/roleserver/parameters"
)

func init() {
	register("write-disk", "write a node's disk image and parameters to a disk (or a file)", func() verb { return new(writeDiskCmd) })
}

// writeDiskCmd is `plinthctl write-disk -image DIR -params FILE -device
// /dev/sdX`: image.WriteDisk with the parameters decoded and validated first.
type writeDiskCmd struct {
	image  string
	params string
	device string
	size   int64
	force  bool
}

func (c *writeDiskCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("write-disk", stderr)
	fs.StringVar(&c.image, "image", "", "build output directory with disk.img (make image: out/image/BOARD)")
	fs.StringVar(&c.params, "params", "", "node parameters file (plinthctl params), put on the ESP")
	fs.StringVar(&c.device, "device", "", "disk device (/dev/sdX) or file to write")
	fs.Int64Var(&c.size, "size", 0, "size in bytes of a file -device that is created or grown (default: the image plus 1 GiB)")
	fs.BoolVar(&c.force, "force", false, "write over a disk that holds a Plinth data partition (its data is lost)")
	fs.Parse(args)
	if c.image == "" || c.params == "" || c.device == "" || fs.NArg() > 0 {
		return fmt.Errorf("usage: plinthctl write-disk -image DIR -params FILE -device /dev/sdX [-force]")
	}
	raw, err := os.ReadFile(c.params)
	if err != nil {
		return fmt.Errorf("-params: %w", err)
	}
	if _, err := parameters.Decode(raw); err != nil {
		return fmt.Errorf("-params %s: %w (nothing was written)", c.params, err)
	}
	return image.WriteDisk(ctx, image.WriteDiskConfig{ImageDir: c.image, Parameters: raw, Target: c.device, Size: c.size, Force: c.force, Progress: stdout})
}
