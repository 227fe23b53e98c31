package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/image"
	"plinth.dev/plinth/roleserver/parameters"
)

func init() {
	add(spec{path: "write-disk", short: "Write a node's disk image and parameters to a disk (or a file)", group: groupImage,
		long: "Write the disk image of a build (plinthctl build --out DIR) and a node's parameters\n" +
			"(plinthctl params) to a disk device or a file. The parameters are decoded and validated\n" +
			"before the target is opened.",
		maxArgs: 0, new: func() command { return new(writeDiskCmd) }})
}

// writeDiskCmd is `plinthctl write-disk --image DIR --params FILE
// --device /dev/sdX`: image.WriteDisk with the parameters decoded and
// validated first.
type writeDiskCmd struct {
	image  string
	params string
	device string
	size   int64
	force  bool
}

func (c *writeDiskCmd) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.image, "image", "", "build output `directory` with disk.img (plinthctl build --out), required")
	fs.StringVar(&c.params, "params", "", "node parameters `file` (plinthctl params), put on the ESP, required")
	fs.StringVar(&c.device, "device", "", "disk `device` (/dev/sdX) or file to write, required")
	fs.Int64Var(&c.size, "size", 0, "size in `bytes` of a file --device that is created or grown (default: the image plus 1 GiB)")
	fs.BoolVar(&c.force, "force", false, "write over a disk that holds a Plinth data partition (its data is lost)")
}

func (c *writeDiskCmd) run(ctx context.Context, e *env, _ []string) error {
	for _, f := range []struct{ name, value string }{{"image", c.image}, {"params", c.params}, {"device", c.device}} {
		if f.value == "" {
			return usagef("--%s is required", f.name)
		}
	}
	raw, err := os.ReadFile(c.params)
	if err != nil {
		return fmt.Errorf("--params: %w", err)
	}
	if _, err := parameters.Decode(raw); err != nil {
		return fmt.Errorf("--params %s: %w (nothing was written)", c.params, err)
	}
	return image.WriteDisk(ctx, image.WriteDiskConfig{ImageDir: c.image, Parameters: raw, Target: c.device, Size: c.size, Force: c.force, Progress: e.stdout})
}
