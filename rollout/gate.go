package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// gateName is the coordinator's gate as the flag that made it.
func (s Strategy) gateName() string {
	if s.GateURL != "" {
		return "--gate-url " + s.GateURL
	}
	return "--gate-prom " + s.GateProm
}

// gateCheckMax bounds one check of a coordinator's gate, within
// GateTimeout: the coordinator does nothing else meanwhile.
const gateCheckMax = 30 * time.Second

// CheckGate runs the coordinator's gate once: a GET of GateURL that must
// answer 2xx, or GateProm asked of PromURL's query API, which holds when
// its result is a non-empty vector (as a Prometheus alert fires), or a
// scalar other than 0. It says why it did not pass.
func CheckGate(ctx context.Context, client *http.Client, s Strategy) (bool, string) {
	limit := min(s.GateTimeoutOr(), gateCheckMax)
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	// A gate that does not answer in time says so, and which flag bounds
	// it (not only "context deadline exceeded").
	failed := func(err error) (bool, string) {
		if parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			who := s.gateName()
			if s.GateURL == "" {
				who = "--prom-url " + s.PromURL
			}
			return false, fmt.Sprintf("%s: no answer within %s (the --gate-timeout deadline)", who, limit)
		}
		return false, err.Error()
	}
	u := s.GateURL
	if u == "" {
		u = strings.TrimSuffix(s.PromURL, "/") + "/api/v1/query?query=" + url.QueryEscape(s.GateProm)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return failed(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return failed(err)
	}
	if resp.StatusCode/100 != 2 {
		return false, fmt.Sprintf("%s answered %s", s.gateName(), resp.Status)
	}
	if s.GateURL != "" {
		return true, ""
	}
	return promHolds(body, s.GateProm)
}

// promHolds reads a Prometheus query answer.
func promHolds(body []byte, expr string) (bool, string) {
	var a struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return false, "not a Prometheus answer: " + err.Error()
	}
	if a.Status != "success" {
		return false, fmt.Sprintf("Prometheus refused %q: %s", expr, a.Error)
	}
	switch a.Data.ResultType {
	case "vector", "matrix":
		var samples []json.RawMessage
		if err := json.Unmarshal(a.Data.Result, &samples); err != nil {
			return false, "not a Prometheus answer: " + err.Error()
		}
		if len(samples) == 0 {
			return false, fmt.Sprintf("%q does not hold (no sample)", expr)
		}
		return true, ""
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(a.Data.Result, &v); err != nil {
			return false, "not a Prometheus answer: " + err.Error()
		}
		if s, _ := v[1].(string); s == "0" || s == "" {
			return false, fmt.Sprintf("%q does not hold (%v)", expr, v[1])
		}
		return true, ""
	}
	return false, fmt.Sprintf("%q: a %s result, want a vector or a scalar", expr, a.Data.ResultType)
}
