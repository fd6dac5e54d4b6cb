// Which changes can reload, need a daemon-reload, and how long a job may
// take.

package reconcile

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestCanReload(t *testing.T) {
	unitF := func(c string) File { return File{Path: "web.service", Content: []byte(c)} }
	drop := func(name, c string) File { return File{Path: "web.service.d/" + name, Content: []byte(c)} }
	for _, tc := range []struct {
		name  string
		unit  string
		files []File
		want  bool
	}{
		{name: "service with ExecReload in the unit file", files: []File{unitF(p2Reload)}, want: true},
		{name: "service without ExecReload", files: []File{unitF(svc)}},
		{name: "service with ExecReload in a drop-in", files: []File{unitF(svc), drop("r.conf", p2ReloadDrop)}, want: true},
		{name: "ExecReload reset by an empty assignment in a later drop-in", files: []File{unitF(p2Reload), drop("z.conf", p2ResetDrop)}},
		{name: "reset then set again in a later drop-in", files: []File{unitF(p2Reload), drop("z.conf", p2ResetDrop+"ExecReload=/bin/true\n")}, want: true},
		{name: "reset, then set in a still later drop-in", files: []File{unitF(p2Reload), drop("a.conf", p2ResetDrop), drop("b.conf", p2ReloadDrop)}, want: true},
		{name: "ExecReload outside [Service] does not count", files: []File{unitF(svc + "[X-Other]\nExecReload=/bin/true\n")}},
		{name: "no files", files: nil},
		{name: "mount: always (remount)", unit: "data.mount", files: []File{{Path: "data.mount", Content: []byte("[Mount]\nWhat=/dev/a\nWhere=/data\n")}}, want: true},
		{name: "mount without files", unit: "data.mount", want: true},
		{name: "timer: never", unit: "t.timer", files: []File{{Path: "t.timer", Content: []byte("[Timer]\nOnCalendar=daily\n[Service]\nExecReload=/bin/true\n")}}},
		{name: "socket: never", unit: "web.socket", files: []File{{Path: "web.socket", Content: []byte("[Socket]\nListenStream=80\n")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unit := tc.unit
			if unit == "" {
				unit = "web.service"
			}
			if got := CanReload(unit, tc.files); got != tc.want {
				t.Fatalf("CanReload = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestReloadNeeded(t *testing.T) {
	owed := UnitState{LoadState: "loaded", ActiveState: "active", NeedDaemonReload: true}
	for _, tc := range []struct {
		name string
		plan []Action
		cur  Current
		want bool
		why  string
	}{
		{name: "interrupted pass owes a reload", cur: Current{
			Memory: Memory{Intent: Intent{Reload: true}},
		}, want: true, why: "interrupted"},
		{name: "a job on a unit with NeedDaemonReload", plan: []Action{{Unit: p2Hello, Kind: KindRestart, Steps: Steps{Job: JobRestart}}},
			cur: Current{Host: HostFacts{Units: map[string]UnitState{p2Hello: owed}}}, want: true, why: "NeedDaemonReload"},
		{name: "NeedDaemonReload without a job", plan: []Action{{Unit: p2Hello, Kind: KindNone}},
			cur: Current{Host: HostFacts{Units: map[string]UnitState{p2Hello: owed}}}},
		{name: "a job, nothing owed", plan: []Action{{Unit: p2Hello, Kind: KindStart, Steps: Steps{Job: JobStart}}},
			cur: Current{Host: HostFacts{Units: map[string]UnitState{p2Hello: running}}}},
		{name: "files written", plan: []Action{{Unit: p2Hello, Kind: KindUpdate, Steps: Steps{Writes: []DesiredFile{{Path: p2Hello}}}}}, want: true, why: "changed"},
		{name: "files removed", plan: []Action{{Unit: p2Hello, Kind: KindRemove, Steps: Steps{Removes: []string{p2Hello}}}}, want: true, why: "changed"},
		{name: "enable only", plan: []Action{{Unit: p2Hello, Kind: KindUpdate, Steps: Steps{Enable: true}}}, want: true},
		{name: "disable only", plan: []Action{{Unit: p2Hello, Kind: KindUpdate, Steps: Steps{Disable: true}}}, want: true},
		{name: "instance marker forgotten only", plan: []Action{{Unit: "web@1.service", Kind: KindRemove, Steps: Steps{Forget: []string{"web@1.service"}}}}},
		{name: "nothing", plan: []Action{{Unit: p2Hello}}, cur: Current{
			Memory: Memory{Intent: Intent{Jobs: map[string]string{p2Hello: "k"}}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := ReloadNeeded(tc.plan, tc.cur)
			if got != tc.want {
				t.Fatalf("ReloadNeeded = %v (%q), want %v", got, why, tc.want)
			}
			if got && (why == "" || !strings.Contains(why, tc.why)) {
				t.Errorf("why = %q, want it to mention %q", why, tc.why)
			}
			if !got && why != "" {
				t.Errorf("why = %q with no reload", why)
			}
		})
	}
}

func TestJobDeadline(t *testing.T) {
	const s = uint64(time.Second / time.Microsecond)
	inf := uint64(math.MaxUint64)
	for _, tc := range []struct {
		name        string
		job         Job
		start, stop uint64
		want        time.Duration
	}{
		{name: "start 7s", job: JobStart, start: 7 * s, stop: 90 * s, want: 7*time.Second + 15*time.Second},
		{name: "start infinity", job: JobStart, start: inf, stop: 90 * s, want: 0},
		{name: "start ignores an infinite stop timeout", job: JobStart, start: 7 * s, stop: inf, want: 22 * time.Second},
		{name: "restart sums stop and start", job: JobRestart, start: 7 * s, stop: 10 * s, want: 32 * time.Second},
		{name: "restart with infinite stop", job: JobRestart, start: 7 * s, stop: inf, want: 0},
		{name: "restart with infinite start", job: JobRestart, start: inf, stop: 10 * s, want: 0},
		{name: "stop uses the stop timeout", job: JobStop, start: 7 * s, stop: 10 * s, want: 25 * time.Second},
		{name: "stop ignores an infinite start timeout", job: JobStop, start: inf, stop: 10 * s, want: 25 * time.Second},
		{name: "stop infinity", job: JobStop, start: 7 * s, stop: inf, want: 0},
		{name: "reload uses the start timeout", job: JobReload, start: 7 * s, stop: 10 * s, want: 22 * time.Second},
		{name: "timer start (no timeouts): default", job: JobStart, want: 90*time.Second + 15*time.Second},
		{name: "timer stop (no timeouts): default", job: JobStop, want: 105 * time.Second},
		{name: "timer restart (no timeouts): both defaults", job: JobRestart, want: 195 * time.Second},
		{name: "sub-second timeout", job: JobStart, start: 500_000, want: 15*time.Second + 500*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := JobDeadline(tc.job, UnitState{TimeoutStartUSec: tc.start, TimeoutStopUSec: tc.stop})
			if got != tc.want {
				t.Fatalf("JobDeadline(%s, start=%d, stop=%d) = %s, want %s", tc.job, tc.start, tc.stop, got, tc.want)
			}
		})
	}
}
