package sidecar

import (
	"errors"
	"fmt"
	"time"

	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/infer/model"
)

// ChooseModel returns the model the sidecar runs on: the override (an embedded
// name or a path) when it is usable at this interval, else the default model
// with a warning saying why the override was refused, because a sidecar never
// crash-loops over its model. Only a command line that the default model
// cannot satisfy either (an interval slower than its sample_interval) is an
// error, wrapping model.ErrFeatureSpec.
func ChooseModel(nameOrPath string, interval time.Duration) (*model.Model, string, error) {
	m, fallbackErr := model.LoadOverride(nameOrPath)
	if m == nil {
		return nil, "", fmt.Errorf("no usable model: %w", fallbackErr)
	}
	if nameOrPath != "" && fallbackErr == nil {
		if _, err := detect.FeatureConfig(m, interval); err != nil {
			def, derr := model.Default()
			if derr != nil {
				return nil, "", fmt.Errorf("no usable model: %w", errors.Join(err, derr))
			}
			m, fallbackErr = def, model.FallbackError(def, err)
		}
	}
	if _, err := detect.FeatureConfig(m, interval); err != nil {
		return nil, "", fmt.Errorf("--interval: %w", err)
	}
	if fallbackErr != nil {
		return m, fallbackErr.Error(), nil
	}
	return m, "", nil
}
