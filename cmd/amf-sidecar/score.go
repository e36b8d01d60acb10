package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/internal/exitcode"
)

func runScore(_ context.Context, args []string, io stdio) int {
	fs := newFlagSet("score", io)
	in := fs.String("in", "", "features CSV (- for standard input)")
	modelPath := fs.String("model", "", modelHelp()+" to score with")
	// The features come ready-made, so the windows are not computed here; given,
	// they state how the input was computed and are checked against the model.
	windows := registerWindowFlags(fs)
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	if *in == "" || fs.NArg() > 0 {
		fmt.Fprintln(io.err, "amf-sidecar score: --in FILE is required (- for standard input)")
		return exitUsage
	}
	// Unlike the sidecar, an offline scorer must not fall back silently: the user
	// asked for that model.
	m, err := loadGivenModel("score", *modelPath, io.err)
	if err == nil {
		_, err = windows.forModel(m, 0)
	}
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar score: %v\n", err)
		return exitUsage
	}
	r, closeIn, err := openInput(*in, io.in)
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar score: %v\n", err)
		return exitUsage
	}
	defer closeIn()
	if err := detect.ScoreCSV(r, io.out, m); err != nil {
		fmt.Fprintf(io.err, "amf-sidecar score: %s: %v\n", *in, err)
		var ie *detect.InputError
		if errors.As(err, &ie) {
			return exitUsage
		}
		return exitFail
	}
	return exitOK
}
