package main

import (
	"os"
	"path/filepath"
	"strings"
)

// Defaults of the image and machine commands live under OUT, the out
// directory of the build that made this plinthctl: make builds it as
// OUT/bin/plinthctl, next to the kernel cache, the images and the run
// state, so the defaults hold from any working directory. Help texts
// name them in words (OUT/image/BOARD), never as this machine's paths.

// outHelp explains OUT in help texts.
const outHelp = "OUT being the directory of plinthctl's bin/"

// executable is os.Executable; tests stand in a binary of their own.
var executable = os.Executable

// outDir is OUT: the parent of the directory the running binary sits
// in. A binary of go run or go test sits in the build cache, not in a
// bin/ of the build; it, and a binary that cannot find itself, use
// "out" in the working directory (the repository's, as go run is used).
func outDir() string {
	exe, err := executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil || strings.Contains(exe, string(filepath.Separator)+"go-build") {
		return "out"
	}
	return filepath.Dir(filepath.Dir(exe))
}
