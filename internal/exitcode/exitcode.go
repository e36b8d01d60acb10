// Package exitcode is the exit status convention of amf-agent, amf-sidecar
// and amf-lab, one for the three:
//
//   - 0: done, asking for help (-h, --help) included;
//   - 2: the command line or its input is wrong (an unknown flag, a value out
//     of range, a document that cannot be injected, a file that is not what it
//     should be): nothing was done; fix it and run again;
//   - 1: a failure while running (a port taken, the API server unreachable,
//     a broker gone): the same command may work once the environment does.
package exitcode

import (
	"errors"
	"flag"
	"fmt"
)

// The exit statuses.
const (
	OK      = 0
	Failure = 1
	Usage   = 2
)

// usageError marks an error as the command line's or its input's.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// UsageErr marks err (nil stays nil) as a usage or input error: Of gives 2.
func UsageErr(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// Usagef is UsageErr(fmt.Errorf(format, args...)).
func Usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Of is the exit status for err: OK for nil and for flag.ErrHelp (help was
// asked for and given), Usage for an error marked by UsageErr or a flag
// package error, Failure for any other.
func Of(err error) int {
	var u usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return OK
	case errors.As(err, &u):
		return Usage
	}
	return Failure
}

// ForParse is the exit status after a FlagSet's Parse returned err: OK for
// -h (the usage was printed), Usage for anything else.
func ForParse(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return OK
	}
	return Usage
}
