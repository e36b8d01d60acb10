package infer

import "math"

// This file holds the PromQL maths, kept as close as possible to Prometheus 3's
// promql/functions.go (extrapolatedRate, linearRegression) and util/kahansum, so that a
// reader can compare them line by line. Only the float, counter, no-start-timestamp
// paths are needed here. Timestamps are Unix milliseconds, as in Prometheus.

// Point is one sample of a series: a Unix-millisecond timestamp and a value.
type Point struct {
	T int64
	V float64
}

// extrapolatedRate is PromQL's rate(v[R]) evaluated at rangeEnd over the points of
// the left-open range (rangeEnd-R, rangeEnd]. ok is false when PromQL would return
// nothing (fewer than two points).
func extrapolatedRate(pts []Point, rangeStart, rangeEnd int64, rangeSeconds float64) (rate float64, ok bool) {
	if len(pts) < 2 {
		return 0, false
	}
	numSamplesMinusOne := len(pts) - 1
	firstT, lastT := pts[0].T, pts[numSamplesMinusOne].T
	result := pts[numSamplesMinusOne].V - pts[0].V
	// Counter resets: whatever the counter had reached before it dropped is added back.
	for i := 1; i < len(pts); i++ {
		if pts[i].V < pts[i-1].V {
			result += pts[i-1].V
		}
	}

	durationToStart := float64(firstT-rangeStart) / 1000
	durationToEnd := float64(rangeEnd-lastT) / 1000
	sampledInterval := float64(lastT-firstT) / 1000
	averageDurationBetweenSamples := sampledInterval / float64(numSamplesMinusOne)
	extrapolationThreshold := averageDurationBetweenSamples * 1.1

	// Extrapolate to the range's edges only when a sample is "close enough" to them;
	// otherwise assume the series starts or ends half an interval away.
	if durationToStart >= extrapolationThreshold {
		durationToStart = averageDurationBetweenSamples / 2
	}
	// A counter cannot go below zero: do not extrapolate past its zero point.
	durationToZero := durationToStart
	if result > 0 && pts[0].V >= 0 {
		durationToZero = sampledInterval * (pts[0].V / result)
	}
	if durationToZero < durationToStart {
		durationToStart = durationToZero
	}
	if durationToEnd >= extrapolationThreshold {
		durationToEnd = averageDurationBetweenSamples / 2
	}

	factor := 1.0
	if sampledInterval != 0 {
		factor = (sampledInterval + durationToStart + durationToEnd) / sampledInterval
	}
	factor /= rangeSeconds
	return result * factor, true
}

// deriv is PromQL's deriv(): the least-squares slope, per second, of the points. ok is
// false with fewer than two points.
func deriv(pts []Point) (slope float64, ok bool) {
	if len(pts) < 2 {
		return 0, false
	}
	// Prometheus passes the first timestamp as intercept time to keep x small.
	slope, _ = linearRegression(pts, pts[0].T)
	return slope, true
}

// predictLinear is PromQL's predict_linear(v[W], duration) evaluated at evalT: the
// least-squares line through the points (deriv's line), read off duration seconds
// after evalT. Prometheus fits with the evaluation time as intercept time, so the
// intercept is the line's value at evalT and the prediction is
//
//	slope*duration + intercept
//
// (funcPredictLinear). ok is false with fewer than two points, where PromQL drops
// the element.
func predictLinear(pts []Point, evalT int64, duration float64) (v float64, ok bool) {
	if len(pts) < 2 {
		return 0, false
	}
	slope, intercept := linearRegression(pts, evalT)
	return slope*duration + intercept, true
}

// linearRegression is Prometheus' ordinary least squares with Kahan-compensated sums.
func linearRegression(pts []Point, interceptTime int64) (slope, intercept float64) {
	var (
		n          float64
		sumX, cX   float64
		sumY, cY   float64
		sumXY, cXY float64
		sumX2, cX2 float64
		initY      float64
		constY     bool
	)
	initY = pts[0].V
	constY = true
	for i, p := range pts {
		if constY && i > 0 && p.V != initY {
			constY = false
		}
		n += 1.0
		x := float64(p.T-interceptTime) / 1e3
		sumX, cX = kahanSumInc(x, sumX, cX)
		sumY, cY = kahanSumInc(p.V, sumY, cY)
		sumXY, cXY = kahanSumInc(x*p.V, sumXY, cXY)
		sumX2, cX2 = kahanSumInc(x*x, sumX2, cX2)
	}
	if constY {
		if math.IsInf(initY, 0) {
			return math.NaN(), math.NaN()
		}
		return 0, initY
	}
	sumX += cX
	sumY += cY
	sumXY += cXY
	sumX2 += cX2

	covXY := sumXY - sumX*sumY/n
	varX := sumX2 - sumX*sumX/n

	slope = covXY / varX
	intercept = sumY/n - slope*sumX/n
	return slope, intercept
}

// kahanSumInc is Prometheus' Kahan–Neumaier step. The float64 conversions are not
// no-ops: they forbid fused multiply-add across the call boundary, which would
// change the rounding (Prometheus PR 16895).
func kahanSumInc(inc, sum, c float64) (newSum, newC float64) {
	inc = float64(inc)
	sum = float64(sum)
	c = float64(c)

	t := sum + inc
	switch {
	case math.IsInf(t, 0):
		c = 0
	case math.Abs(sum) >= math.Abs(inc):
		c += (sum - t) + inc
	default:
		c += (inc - t) + sum
	}

	t = float64(t)
	c = float64(c)
	return t, c
}
