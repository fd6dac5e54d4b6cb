package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

var (
	alertsFile    = filepath.Join("..", "..", "contrib", "prometheus", "agentd-alerts.yml")
	dashboardFile = filepath.Join("..", "..", "contrib", "grafana", "agentd.json")
)

// The alerting rules and the Grafana dashboard use only metrics a running
// agent really exports: every rule is parsed with Prometheus' own rule
// parser (which parses its PromQL too), every expression of the dashboard
// with Prometheus' PromQL parser (Grafana's variables substituted first),
// and every metric name, label name and literal label value they select
// is looked up in a live /metrics scrape of an agent that has started and
// restarted a unit of a group with MaxUnavailable=, and serves FleetLock,
// and of a git mirror that has mirrored a commit and refused one.
func TestContribRulesAndDashboardUseExportedMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.groups = []string{"web"}
	metricsAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	flAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) {
		o.metricsAddr, o.fleetLockAddr, o.fleetLockTTL = metricsAddr, flAddr, time.Minute
	})
	waitJoined(t, e)
	for _, v := range []string{"1", "2"} { // a start, then a restart inside a slot
		content := "[Service]\nType=exec\nExecStart=/bin/sleep 100" + v + "\n[X-Agentd]\nMaxUnavailable=1\nHealthySec=0\n"
		if out, code := e.cli("unit", "put", e.writeUnit("app.service", content), "--group", "web", "--wait", "--timeout", "30s"); code != 0 {
			t.Fatalf("unit put: exit %d\n%s", code, out)
		}
	}
	fleetLockCall(t, flAddr, "pre-reboot", "node-1", "web")
	fleetLockCall(t, flAddr, "steady-state", "node-1", "web")
	scraped := parseScrape(t, agentMetrics(t, metricsAddr))
	// The mirror's series, from a running mirror's /metrics: it exports
	// them on its own --metrics-addr (a scrape job of its own).
	for name, f := range mirrorScrape(t, e.endpoint) {
		scraped[name] = f
	}

	var exprs []contribExpr
	groups, errs := rulefmt.ParseFile(alertsFile, false)
	if len(errs) > 0 {
		t.Fatalf("Prometheus' rule parser refuses %s: %v", alertsFile, errs)
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, contribExpr{alertsFile + ": " + g.Name + "/" + r.Alert + r.Record, r.Expr})
		}
	}
	nRules := len(exprs)
	exprs = append(exprs, dashboardExprs(t, dashboardFile)...)
	if nRules < 6 || len(exprs)-nRules < 20 {
		t.Fatalf("found %d rules and %d dashboard expressions: the files were not read as meant", nRules, len(exprs)-nRules)
	}
	for _, x := range exprs {
		for _, problem := range scraped.check(x.expr) {
			t.Errorf("%s: %s\n\texpr: %s", x.where, problem, x.expr)
		}
	}

	// The check itself: a name, label or value the agent does not export
	// is caught, by name.
	for expr, want := range map[string]string{
		`rate(agentd_no_such_thing_total[5m])`:                    "agentd_no_such_thing_total is not exported by the agent",
		`agentd_units{status="failed"}`:                           `agentd_units has no label "status"`,
		`agentd_units{state="faild"}`:                             `agentd_units has no series with state="faild"`,
		`agentd_daemon_reload_duration_seconds_bucket{le="0.1"}`:  "",
		`sum(rate(agentd_reconcile_duration_seconds_count[5m]))`:  "",
		`up{job="agentd", instance="h1:9100"} == 0`:               "",
		`agentd_slots_held{job="agentd", group="web"}`:            "",
		`histogram_quantile(0.9, agentd_units_by_active_state)`:   "",
		`agentd_fleetlock_requests_total{endpoint="pre-reboot"}`:  "",
		`agentd_rollout_halts{group=~".*"} > 0`:                   "",
		`agentd_actions_total{kind="restart", result="done"} > 0`: "",
		`agentd_mirror_commits_refused_total{reason="unsigned"}`:  "",
		`agentd_mirror_commits_refused_total{reason="unsign"}`:    `agentd_mirror_commits_refused_total has no series with reason="unsign"`,
		`agentd_mirror_leader{mirror="default"} == 1`:             "",
	} {
		got := strings.Join(scraped.check(expr), "; ")
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("check(%s) = %q, want %q", expr, got, want)
		}
	}
}

type contribExpr struct{ where, expr string }

// promSynthesized are the series Prometheus itself records for every
// target it scrapes, and targetLabels the labels it attaches to every
// series: no agent exports them.
var (
	promSynthesized = []string{"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling", "scrape_series_added"}
	targetLabels    = []string{"job", "instance"}
)

// scrape is a parsed /metrics answer: the families by name.
type scrape map[string]*dto.MetricFamily

func parseScrape(t *testing.T, text string) scrape {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse the scrape: %v", err)
	}
	return fams
}

// family finds the family a series name belongs to: itself, or a
// histogram's _bucket, _sum and _count, or a summary's _sum and _count.
// extra is the label the suffix adds (le for _bucket).
func (s scrape) family(name string) (f *dto.MetricFamily, extra string, ok bool) {
	if f, ok := s[name]; ok {
		return f, "", true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, found := strings.CutSuffix(name, suf)
		if !found {
			continue
		}
		f, ok := s[base]
		switch {
		case !ok:
		case f.GetType() == dto.MetricType_HISTOGRAM:
			if suf == "_bucket" {
				extra = "le"
			}
			return f, extra, true
		case f.GetType() == dto.MetricType_SUMMARY && suf != "_bucket":
			return f, "", true
		}
	}
	return nil, "", false
}

// check parses expr with Prometheus' PromQL parser and returns what in it
// the scrape does not have: a metric name, a label name, or a literal
// value of an equality matcher.
func (s scrape) check(expr string) []string {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return []string{"PromQL does not parse: " + err.Error()}
	}
	var problems []string
	selectors := 0
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		selectors++
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			problems = append(problems, fmt.Sprintf("selector %s names no metric", vs))
			return nil
		}
		if slices.Contains(promSynthesized, name) {
			return nil // Prometheus' own per-target series
		}
		f, extra, ok := s.family(name)
		if !ok {
			problems = append(problems, name+" is not exported by the agent")
			return nil
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName || slices.Contains(targetLabels, m.Name) || m.Name == extra {
				continue
			}
			values := map[string]bool{}
			for _, metric := range f.GetMetric() {
				for _, l := range metric.GetLabel() {
					if l.GetName() == m.Name {
						values[l.GetValue()] = true
					}
				}
			}
			switch {
			case len(values) == 0:
				problems = append(problems, fmt.Sprintf("%s has no label %q", name, m.Name))
			case m.Type == labels.MatchEqual && !values[m.Value]:
				problems = append(problems, fmt.Sprintf("%s has no series with %s=%q (it has %s)", name, m.Name, m.Value, strings.Join(sortedKeys(values), ", ")))
			}
		}
		return nil
	})
	if selectors == 0 {
		problems = append(problems, "selects no metric")
	}
	return problems
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

var (
	grafanaInterval = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)(_ms|_s)?\}?`)
	grafanaVar      = regexp.MustCompile(`\$\{(\w+)(:\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)
	labelValues     = regexp.MustCompile(`^\s*label_values\((.*),\s*\w+\s*\)\s*$`)
)

// dashboardExprs returns every PromQL expression of a Grafana dashboard:
// the panels' targets ("expr", rows' nested panels included) and the
// query variables (label_values(<selector>, <label>)), with Grafana's
// variables replaced by what PromQL parses: $__rate_interval and its kind
// by 5m, the others by .* (they are used in regex matchers).
func dashboardExprs(t *testing.T, path string) []contribExpr {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	subst := func(s string) string {
		return grafanaVar.ReplaceAllString(grafanaInterval.ReplaceAllString(s, "5m"), ".*")
	}
	var out []contribExpr
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where += " / " + title
			}
			if expr, ok := v["expr"].(string); ok {
				out = append(out, contribExpr{where, subst(expr)})
			}
			for _, c := range v {
				walk(where, c)
			}
		case []any:
			for _, c := range v {
				walk(where, c)
			}
		}
	}
	walk(path, dash["panels"])
	templating, _ := dash["templating"].(map[string]any)
	vars, _ := templating["list"].([]any)
	for _, v := range vars {
		v, _ := v.(map[string]any)
		if v["type"] != "query" {
			continue
		}
		q, _ := v["query"].(string)
		if qm, ok := v["query"].(map[string]any); ok {
			q, _ = qm["query"].(string)
		}
		if m := labelValues.FindStringSubmatch(q); m != nil {
			q = m[1]
		}
		out = append(out, contribExpr{fmt.Sprintf("%s: variable $%v", path, v["name"]), subst(q)})
	}
	return out
}
