package main

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/image"
)

func init() {
	add(spec{path: "fetch-kernel", short: "Download the board's Debian kernel package into the cache, and print its path", group: groupImage,
		maxArgs: 0, new: func() command { return new(fetchKernelCmd) }})
}

// fetchKernelCmd is `plinthctl fetch-kernel`: it prints the package's path.
type fetchKernelCmd struct {
	board string
	cache string
}

func (c *fetchKernelCmd) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.board, "board", board.Default, "`board` whose kernel to fetch")
	fs.StringVar(&c.cache, "cache", "", "cache `directory` (default OUT/cache, "+outHelp+")")
}

func (c *fetchKernelCmd) run(ctx context.Context, e *env, _ []string) error {
	b, err := board.Get(c.board)
	if err != nil {
		return usageError{err}
	}
	if c.cache == "" {
		c.cache = filepath.Join(outDir(), "cache")
	}
	p, err := image.FetchKernelPackage(ctx, b.KernelPackage, c.cache, e.stderr)
	if err == nil {
		fmt.Fprintln(e.stdout, p)
	}
	return err
}
