package workerapp

import "go.uber.org/zap"

// StartMetricsForTest runs the worker's metrics start-up alone on addr (no ledger collector
// queries are made) and returns the URL served ("" when none) and a stop function.
func StartMetricsForTest(addr string, log *zap.Logger) (url string, stop func(), err error) {
	wm, err := startMetrics(Config{MetricsAddr: addr, Logger: log}, nil)
	if err != nil {
		return "", func() {}, err
	}
	if wm != nil && wm.srv != nil {
		url = wm.srv.URL()
	}
	return url, wm.close, nil
}
