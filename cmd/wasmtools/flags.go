package main

import (
	"errors"
	"flag"
)

// parseFlags parses args with fs, flags before, between and after the
// positional arguments (`serve DIR --http ADDR` as `serve --http ADDR
// DIR`): Go's flag package stops at the first positional argument, and a
// flag after it would be taken for a path, silently. "--" ends the flags;
// what follows is positional, whatever it looks like. fs.Args() is then
// the positional arguments, in order.
func parseFlags(fs *flag.FlagSet, args []string) error {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			positional = append(positional, rest...) // after "--"
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	return fs.Parse(append([]string{"--"}, positional...))
}

// flagsExit is a command's exit code when parseFlags failed: 0 for -help
// (the usage asked for, printed), 2 for a bad flag.
func flagsExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}
