package main

import (
	"context"
	"fmt"
	"io"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/image"
)

func init() {
	register("fetch-kernel", "download the board's Debian kernel package into the cache", func() verb { return new(fetchKernelCmd) })
}

// fetchKernelCmd is `plinthctl fetch-kernel`: it prints the package's path.
type fetchKernelCmd struct {
	board string
	cache string
}

func (c *fetchKernelCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fetch-kernel", stderr)
	fs.StringVar(&c.board, "board", board.Default, "board")
	fs.StringVar(&c.cache, "cache", "out/cache", "cache directory")
	fs.Parse(args)
	b, err := board.Get(c.board)
	if err != nil {
		return err
	}
	p, err := image.FetchKernelPackage(ctx, b.KernelPackage, c.cache, stderr)
	if err == nil {
		fmt.Fprintln(stdout, p)
	}
	return err
}
