package scan

// PairRatio and Ratios expose one run's ratio and the line of ratios to the tests.
var (
	PairRatio = pairRatio
	Ratios    = ratios
)
