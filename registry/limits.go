package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/agentd/agentd/reconcile"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The limits every write is held to before it is sent. etcd refuses a
// request over them with a gRPC error ("trying to send message larger than
// max (3108174 vs. 2097152)") an operator cannot act on; agentd says
// instead what was too large, what the limit is and which setting raises it.
const (
	// MaxRequestBytes is the largest request etcd takes: its default
	// --max-request-bytes (1.5 MiB), which the embedded etcd keeps. It is
	// below the client's own send limit (clientv3's default
	// MaxCallSendMsgSize, 2 MiB), so it is the limit a write meets first.
	// etcd compares it with the request as its raft log entry holds it:
	// the transaction with a small header.
	MaxRequestBytes = 3 << 19
	// MaxTxnOps is the operations one transaction may hold (etcd counts
	// its compares and its operations apart): the --max-txn-ops the
	// embedded etcd runs with. A put writes each key, its history record
	// and a prune, so etcd's default of 128 would cap it at about 60 keys; an
	// external cluster needs the same setting.
	MaxTxnOps = 1024
	// raftHeaderSlack stands for the parts of the raft entry that a
	// client cannot know exactly (the user name, when auth is on).
	raftHeaderSlack = 128
)

// ErrTooLarge is wrapped by a LimitError: the write is over one of the
// registry's limits. Nothing was written.
var ErrTooLarge = errors.New("over the registry's limits")

// Limit names the limit a LimitError is about.
type Limit int

const (
	LimitValue   Limit = iota + 1 // one value's bytes (reconcile.MaxValueSize)
	LimitOps                      // one transaction's operations (MaxTxnOps)
	LimitRequest                  // one request's bytes (MaxRequestBytes)
)

// LimitError says, in an operator's words, that a write is over a limit
// and what to do; nothing was written. Server is set when etcd itself
// refused it (its own limit is lower than the one agentd checks against):
// Max is then agentd's, and Size what agentd measured.
type LimitError struct {
	Op     string // "put" or "removal"
	Target Target
	Limit  Limit
	Key    string // LimitValue: the unit key
	Keys   int    // unit keys in the write
	Size   int    // bytes, or operations for LimitOps
	Max    int
	Server bool
	// Write names the write in the message when it is not one put or
	// removal of one target (a mirrored commit: "commit 0123456789ab of
	// mirror default"); "" reads "this <Op> to <Target>".
	Write string
}

// what names the write: "this put to groups/web", or Write.
func (e *LimitError) what() string {
	if e.Write != "" {
		return e.Write
	}
	return fmt.Sprintf("this %s to %s", e.Op, e.Target)
}

func (e *LimitError) Error() string {
	nothing := "nothing stored"
	if e.Op == "removal" {
		nothing = "nothing removed"
	}
	switch {
	case e.Limit == LimitValue:
		return fmt.Sprintf("%s is %s; the registry takes at most %s in one value: make it smaller (agentd's limit for a unit file); %s",
			e.Key, decimalBytes(e.Size), binaryBytes(e.Max), nothing)
	case e.Limit == LimitOps && e.Server:
		return fmt.Sprintf("%s is %d operations in one transaction (%d keys, each with its history record); etcd refused it: its --max-txn-ops is lower than the %d agentd needs: split it, or raise the server's limit; %s",
			e.what(), e.Size, e.Keys, e.Max, nothing)
	case e.Limit == LimitOps:
		return fmt.Sprintf("%s is %d operations in one transaction (%d keys, each with its history record); the registry takes at most %d (etcd's --max-txn-ops): split it, or raise the server's limit; %s",
			e.what(), e.Size, e.Keys, e.Max, nothing)
	case e.Server:
		return fmt.Sprintf("%s is %s (%d keys, each with a copy in its history); etcd refused it as too large for one request: its --max-request-bytes is lower than the %s agentd allows: split it, or raise the server's limit; %s",
			e.what(), decimalBytes(e.Size), e.Keys, binaryBytes(e.Max), nothing)
	}
	return fmt.Sprintf("%s is %s (%d keys, each with a copy in its history); the registry takes at most %s in one request (etcd's --max-request-bytes): split it, or raise the server's limit; %s",
		e.what(), decimalBytes(e.Size), e.Keys, binaryBytes(e.Max), nothing)
}

func (e *LimitError) Unwrap() error { return ErrTooLarge }

// decimalBytes is how big a thing is, as an operator reads sizes (ls -h
// --si, a file manager): "3.1 MB", "300.0 kB".
func decimalBytes(n int) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d bytes", n)
}

// binaryBytes is a limit as etcd and agentd define it: "1.5 MiB", "256 KiB".
func binaryBytes(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%g MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%g KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// checkValues refuses a value over reconcile.MaxValueSize: agents refuse
// to write one (ValidateContent), so storing it would only fail later, on
// every host.
func checkValues(t Target, units map[string][]byte) error {
	for _, u := range slices.Sorted(maps.Keys(units)) {
		if n := len(units[u]); n > reconcile.MaxValueSize {
			return &LimitError{Op: "put", Target: t, Limit: LimitValue, Key: u, Keys: len(units), Size: n, Max: reconcile.MaxValueSize}
		}
	}
	return nil
}

// checkLimits refuses w, before it is sent, when etcd would: more
// compares or operations than MaxTxnOps, or more bytes than
// MaxRequestBytes.
func checkLimits(w *writeTxn) error {
	return checkTxnLimits(&w.txn, LimitError{Op: w.op, Target: w.target, Keys: w.keys})
}

// checkTxnLimits is checkLimits for any transaction x; e says what x
// writes (Op, Target, Keys, Write), the rest is filled in.
func checkTxnLimits(x *txn, e LimitError) error {
	if n := max(len(x.ifs), len(x.ops)); n > MaxTxnOps {
		e.Limit, e.Size, e.Max = LimitOps, n, MaxTxnOps
		return &e
	}
	if n := requestBytes(*x); n > MaxRequestBytes {
		e.Limit, e.Size, e.Max = LimitRequest, n, MaxRequestBytes
		return &e
	}
	return nil
}

// serverLimit is the LimitError (Server set) for err when etcd refused x
// for its size, else nil; e says what x writes, as for checkTxnLimits.
func serverLimit(err error, x *txn, e LimitError) error {
	e.Server = true
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps):
		e.Limit, e.Size, e.Max = LimitOps, max(len(x.ifs), len(x.ops)), MaxTxnOps
		return &e
	case errors.Is(err, rpctypes.ErrRequestTooLarge) || status.Code(err) == codes.ResourceExhausted:
		e.Limit, e.Size, e.Max = LimitRequest, requestBytes(*x), MaxRequestBytes
		return &e
	}
	return nil
}

// requestBytes is the size etcd compares with its --max-request-bytes:
// the transaction inside a raft request with its header.
func requestBytes(w txn) int {
	req := &pb.TxnRequest{}
	for i := range w.ifs {
		req.Compare = append(req.Compare, w.ifs[i].GetCompare())
	}
	for _, op := range w.ops {
		req.Success = append(req.Success, requestOp(op))
	}
	raft := &pb.InternalRaftRequest{Header: &pb.RequestHeader{ID: math.MaxUint64, AuthRevision: math.MaxInt64}, Txn: req}
	return proto.Size(raft) + raftHeaderSlack
}

// requestOp is op as the client sends it (clientv3 keeps its own
// conversion private); a write only holds puts and deletes.
func requestOp(op clientv3.Op) *pb.RequestOp {
	switch {
	case op.IsPut():
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: op.KeyBytes(), Value: op.ValueBytes()}}}
	case op.IsDelete():
		return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: op.KeyBytes(), RangeEnd: op.RangeBytes()}}}
	}
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: op.KeyBytes(), RangeEnd: op.RangeBytes()}}}
}

// commitWrite checks w against the limits, then commits it. An error
// etcd still returns for its size (a server whose limits are lower than
// agentd's) comes back as the same LimitError, with Server set; a
// LimitError says what and where in its own words, any other error is
// wrapped with the keys.
func (c *Client) commitWrite(ctx context.Context, w *writeTxn) (*clientv3.TxnResponse, error) {
	if err := checkLimits(w); err != nil {
		return nil, err
	}
	resp, err := w.commit(ctx, c.cli)
	if err == nil {
		return resp, nil
	}
	if lerr := serverLimit(err, &w.txn, LimitError{Op: w.op, Target: w.target, Keys: w.keys}); lerr != nil {
		return nil, lerr
	}
	verb := "put"
	if w.removal() {
		verb = "remove"
	}
	return nil, fmt.Errorf("%s %s (%s): %w", verb, c.targetUnits(w.target), strings.Join(w.names, ", "), err)
}
