package registry

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/agentd/agentd/rollout"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// campaignResult is what a Campaign run in the background returned.
type campaignResult struct {
	co  *Coordination
	err error
}

func campaignAsync(ctx context.Context, s *Session, group string) <-chan campaignResult {
	ch := make(chan campaignResult, 1)
	go func() {
		co, err := s.Campaign(ctx, group)
		ch <- campaignResult{co, err}
	}()
	return ch
}

func waitCampaign(t *testing.T, ch <-chan campaignResult, who string) *Coordination {
	t.Helper()
	select {
	case res := <-ch:
		if res.err != nil {
			t.Fatalf("%s's campaign: %v", who, res.err)
		}
		return res.co
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not win the election", who)
	}
	return nil
}

// One coordinator per group, elected on the agents' membership leases: the
// first candidate wins and the second waits until the first resigns, or
// its lease goes; the admissions a term writes reach the admitted host's
// watch, and a term that ended writes nothing (ErrNotCoordinator).
func TestCampaignOneCoordinatorPerGroup(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	web := Target{Group: "web"}
	mustPut(t, c, web, "a.service", "A1")
	s := rollout.Strategy{Canary: rollout.Count{N: 1}, MaxRestarts: -1}
	r := &rollout.Record{ID: "r1", Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	if _, err := c.Put(ctx, web, map[string][]byte{"a.service": []byte("A2")}, WithRollout(r, false)); err != nil {
		t.Fatal(err)
	}
	v, err := c.Rollout(ctx, "r1", false)
	if err != nil {
		t.Fatal(err)
	}
	rec := v.Record
	if v.Coordinator != "" {
		t.Errorf("coordinator %q before any campaign", v.Coordinator)
	}
	s1 := mustJoin(t, c, member("h1", "m1"))
	s2 := mustJoin(t, c, member("h2", "m2"))
	w1, _ := runWatch(t, c, "h1", []string{"web"})
	w2, _ := runWatch(t, c, "h2", []string{"web"})
	coordinator := func() string {
		t.Helper()
		h, err := c.Coordinator(ctx, "web")
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	admitted := func(host string) *rollout.Admission {
		t.Helper()
		resp, err := c.cli.Get(ctx, c.prefix+"/rollouts/admit/web/"+host+"/r1")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		var a rollout.Admission
		if err := json.Unmarshal(resp.Kvs[0].Value, &a); err != nil {
			t.Fatalf("admission of %s: %v", host, err)
		}
		return &a
	}

	co1 := waitCampaign(t, campaignAsync(ctx, s1, "web"), "h1")
	if co1.Host() != "h1" || coordinator() != "h1" {
		t.Fatalf("after h1's campaign: term of %q, coordinator %q", co1.Host(), coordinator())
	}
	second := campaignAsync(ctx, s2, "web")
	select {
	case res := <-second:
		t.Fatalf("h2 won the election while h1 holds it: %+v", res)
	case <-time.After(300 * time.Millisecond):
	}

	// h1's term admits h2: one key, which h2's watch hands out.
	if err := co1.Admit(ctx, rec, []string{"h2"}, rollout.Admission{Wave: 1, At: time.Now().UTC(), By: "h1"}); err != nil {
		t.Fatal(err)
	}
	if a := admitted("h2"); a == nil || a.By != "h1" || a.Wave != 1 {
		t.Fatalf("h2's admission: %+v", a)
	}
	w2.waitFor(t, "h2's admission", 5*time.Second, func(s Snapshot) bool { return s.Rollouts.Admitted["r1"] })

	// h1 resigns: h2 takes over at once, and h1's term writes nothing.
	co1.Resign(ctx)
	co2 := waitCampaign(t, second, "h2")
	if co2.Host() != "h2" || coordinator() != "h2" {
		t.Fatalf("after h1 resigned: term of %q, coordinator %q", co2.Host(), coordinator())
	}
	before, err := c.cli.Get(ctx, c.prefix+"/rollouts/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	errResigned := co1.Admit(ctx, rec, []string{"h1"}, rollout.Admission{Wave: 0, At: time.Now().UTC(), By: "h1"})
	if errResigned == nil || admitted("h1") != nil {
		t.Fatalf("an admission by a resigned coordinator: %v, key %+v", errResigned, admitted("h1"))
	}
	if err := co1.WriteSummary(ctx, rollout.Summary{ID: "r1"}); err == nil {
		t.Error("a resigned coordinator wrote a summary")
	}
	after, err := c.cli.Get(ctx, c.prefix+"/rollouts/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if after.Count != before.Count || after.Header.Revision != before.Header.Revision {
		t.Errorf("a resigned coordinator's writes changed the registry: %d keys at %d, then %d at %d",
			before.Count, before.Header.Revision, after.Count, after.Header.Revision)
	}

	// h1 stands again, behind h2; h2's lease goes (its agent died): h1
	// takes over, and h2's term is lost and writes nothing.
	third := campaignAsync(ctx, s1, "web")
	select {
	case res := <-third:
		t.Fatalf("h1 won the election while h2 holds it: %+v", res)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := c.cli.Revoke(ctx, s2.Lease()); err != nil {
		t.Fatal(err)
	}
	co3 := waitCampaign(t, third, "h1")
	if co3.Host() != "h1" || coordinator() != "h1" {
		t.Fatalf("after h2's lease went: term of %q, coordinator %q", co3.Host(), coordinator())
	}
	defer co3.Resign(ctx)
	select {
	case <-co2.Lost():
	case <-time.After(10 * time.Second):
		t.Error("h2's term is not lost with its lease")
	}
	if err := co2.Admit(ctx, rec, []string{"h1"}, rollout.Admission{Wave: 0, At: time.Now().UTC(), By: "h2"}); !errors.Is(err, ErrNotCoordinator) || admitted("h1") != nil {
		t.Fatalf("an admission by a coordinator whose lease went: %v, key %+v", err, admitted("h1"))
	}
	if ok, err := co2.End(ctx, rec, rollout.End{State: rollout.Failed, At: time.Now().UTC()}); ok || !errors.Is(err, ErrNotCoordinator) {
		t.Errorf("an end by a coordinator whose lease went: %v %v, want ErrNotCoordinator", ok, err)
	}

	// The new term admits h1, which h1's watch hands out.
	if err := co3.Admit(ctx, rec, []string{"h1"}, rollout.Admission{Wave: 0, At: time.Now().UTC(), By: "h1"}); err != nil {
		t.Fatal(err)
	}
	w1.waitFor(t, "h1's admission", 5*time.Second, func(s Snapshot) bool { return s.Rollouts.Admitted["r1"] })
	if a := admitted("h1"); a == nil || a.By != "h1" {
		t.Errorf("h1's admission: %+v", a)
	}

	// A term that resigned says so: it is no longer the coordinator.
	if !errors.Is(errResigned, ErrNotCoordinator) {
		t.Errorf("an admission by a resigned coordinator: %v, want ErrNotCoordinator", errResigned)
	}
}
