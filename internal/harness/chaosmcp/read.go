package chaosmcp

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// NotFoundStyle selects how a read of an unknown resource is answered.
type NotFoundStyle int

const (
	// NotFoundMCP answers -32002 "Resource not found" with data {"uri": ...} (the MCP
	// specification's code; the go-sdk before v1.7).
	NotFoundMCP NotFoundStyle = iota
	// NotFoundInvalidParams answers -32602 "Resource not found" with data {"uri": ...}
	// (the go-sdk v1.7 and later).
	NotFoundInvalidParams
	// NotFoundMessage answers -32602 with the message "Resource <uri> not found" and no data
	// (the TypeScript SDK).
	NotFoundMessage
	// NotFoundBare answers -32602 "unknown resource" with no data: only the code says not
	// found, as 2026-07-28 allows.
	NotFoundBare
)

// ReadFailure is the answer a [ReadFault] substitutes for the resource's content.
type ReadFailure int

const (
	// ReadOK answers with the content (possibly late).
	ReadOK ReadFailure = iota
	// ReadNotFound answers as if the resource did not exist, in the server's NotFoundStyle.
	ReadNotFound
	// ReadTransient answers -32603 "transient failure, retry later".
	ReadTransient
	// ReadEmpty answers a result with no contents, which 2026-07-28 forbids for a missing
	// resource (issue 13 item 6).
	ReadEmpty
)

// TransientMessage is the message of the error a ReadTransient fault answers with.
const TransientMessage = "transient failure, retry later"

// ReadFault changes how matching resources/read requests are answered.
type ReadFault struct {
	// URI matches reads of exactly this URI; "" matches every read.
	URI string
	// Nth, when > 0, matches only the Nth matching read counted from when the fault was
	// added (1-based); the fault is then spent. 0 matches every matching read.
	Nth int
	// Every, when > 0 (and Nth is 0), matches every Every-th matching read: reads Every,
	// 2·Every, … counted from when the fault was added.
	Every int
	// Delay answers this much later (or when the client cancels, or the session ends).
	Delay time.Duration
	// Gate, when non-nil, holds the answer until Gate.Release (or the client cancels, or the
	// session ends).
	Gate *Gate
	// Fail answers with an error instead of content.
	Fail ReadFailure
	// Fresh looks the resource up after the wait. By default the content is taken when the
	// read arrives, so a held read returns what was current then — a slow response.
	Fresh bool
}

// readFaults are the read knobs; guarded by Server.mu.
type readFaults struct {
	notFound NotFoundStyle
	faults   []*readFaultState
	// lastMeta is the _meta of the latest resources/read of each URI (nil entries included).
	lastMeta map[string]map[string]any
}

// LastReadMeta returns a copy of the _meta of the latest resources/read request of uri, and
// whether such a read arrived; a read without _meta gives a nil map and true.
func (s *Server) LastReadMeta(uri string) (map[string]any, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.read.lastMeta[uri]
	return maps.Clone(m), ok
}

type readFaultState struct {
	ReadFault
	seen int
}

// Gate holds requests until the test releases it. Create it with [NewGate].
type Gate struct {
	arriveOnce  sync.Once
	arrived     chan struct{}
	releaseOnce sync.Once
	released    chan struct{}
}

// NewGate returns a gate that holds requests until Release is called.
func NewGate() *Gate {
	return &Gate{arrived: make(chan struct{}), released: make(chan struct{})}
}

// Arrived is closed once the first request reached the gate (its content already taken,
// unless Fresh).
func (g *Gate) Arrived() <-chan struct{} { return g.arrived }

// Release lets every held request, and every later one, through. It is idempotent.
func (g *Gate) Release() { g.releaseOnce.Do(func() { close(g.released) }) }

func (g *Gate) arrive() { g.arriveOnce.Do(func() { close(g.arrived) }) }

// AddReadFault installs f; faults are consulted in the order they were added and the first
// one that matches a read applies (every fault with a matching URI counts the read). The
// returned function removes the fault.
func (s *Server) AddReadFault(f ReadFault) (remove func()) {
	st := &readFaultState{ReadFault: f}
	s.mu.Lock()
	s.read.faults = append(s.read.faults, st)
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.read.faults = slices.DeleteFunc(s.read.faults, func(x *readFaultState) bool { return x == st })
	}
}

// SetNotFoundStyle selects how reads of unknown resources (and ReadNotFound faults) are
// answered. The default is NotFoundMCP.
func (s *Server) SetNotFoundStyle(style NotFoundStyle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.read.notFound = style
}

// matchReadLocked returns the fault that applies to a read of uri, or nil.
func (s *Server) matchReadLocked(uri string) *ReadFault {
	var hit *ReadFault
	var spent []*readFaultState
	for _, f := range s.read.faults {
		if f.URI != "" && f.URI != uri {
			continue
		}
		f.seen++
		if hit != nil {
			continue
		}
		if (f.Nth > 0 && f.seen == f.Nth) || (f.Nth == 0 && (f.Every <= 1 || f.seen%f.Every == 0)) {
			rf := f.ReadFault
			hit = &rf
			if f.Nth > 0 {
				spent = append(spent, f)
			}
		}
	}
	if len(spent) > 0 {
		s.read.faults = slices.DeleteFunc(s.read.faults, func(x *readFaultState) bool { return slices.Contains(spent, x) })
	}
	return hit
}

// handleRead answers resources/read from the server's resource set, through the read faults.
func (s *Server) handleRead(ctx context.Context, req mcp.Request) (mcp.Result, error) {
	p, ok := req.GetParams().(*mcp.ReadResourceParams)
	if !ok || p == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "missing params"}
	}
	uri := p.URI
	s.mu.Lock()
	s.stats.Reads[uri]++
	if s.read.lastMeta == nil {
		s.read.lastMeta = map[string]map[string]any{}
	}
	s.read.lastMeta[uri] = maps.Clone(p.Meta)
	s.changedLocked()
	fault := s.matchReadLocked(uri)
	sess := s.sessions[sessionPtr(req)]
	r, found := s.lookupLocked(uri)
	style := s.read.notFound
	s.mu.Unlock()

	if fault != nil {
		if err := waitFault(ctx, sess, fault); err != nil {
			return nil, err
		}
		switch fault.Fail {
		case ReadNotFound:
			return nil, notFoundError(uri, style)
		case ReadTransient:
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: TransientMessage}
		case ReadEmpty:
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{}}, nil
		}
		if fault.Fresh {
			s.mu.Lock()
			r, found = s.lookupLocked(uri)
			style = s.read.notFound
			s.mu.Unlock()
		}
	}
	if !found {
		return nil, notFoundError(uri, style)
	}
	c := &mcp.ResourceContents{URI: r.URI, MIMEType: r.MIMEType}
	if r.Blob != nil {
		c.Blob = r.Blob
	} else {
		c.Text = r.Text
	}
	res := &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}}
	res.CacheScope = "public"
	return res, nil
}

// lookupLocked returns a copy of the resource stored under uri.
func (s *Server) lookupLocked(uri string) (Resource, bool) {
	r, ok := s.resources[uri]
	if !ok {
		return Resource{}, false
	}
	c := *r
	c.Blob = slices.Clone(r.Blob)
	return c, true
}

// waitFault waits for the fault's gate and delay; it fails when the client cancels the
// request or the server ends the session.
func waitFault(ctx context.Context, sess *session, f *ReadFault) error {
	var closing <-chan struct{}
	if sess != nil {
		closing = sess.closing
	}
	if f.Gate != nil {
		f.Gate.arrive()
		select {
		case <-f.Gate.released:
		case <-ctx.Done():
			return fmt.Errorf("chaosmcp: held read abandoned: %w", context.Cause(ctx))
		case <-closing:
			return errSessionEnded
		}
	}
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("chaosmcp: delayed read abandoned: %w", context.Cause(ctx))
		case <-closing:
			return errSessionEnded
		}
	}
	return nil
}

// notFoundError builds the not-found answer in the given style.
func notFoundError(uri string, style NotFoundStyle) error {
	data, err := json.Marshal(map[string]string{"uri": uri})
	if err != nil {
		panic(fmt.Sprintf("chaosmcp: marshal not-found data: %v", err)) // cannot happen
	}
	switch style {
	case NotFoundInvalidParams:
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Resource not found", Data: data}
	case NotFoundMessage:
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("Resource %s not found", uri)}
	case NotFoundBare:
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "unknown resource"}
	default:
		return &jsonrpc.Error{Code: CodeResourceNotFound, Message: "Resource not found", Data: data}
	}
}

func sessionPtr(req mcp.Request) *mcp.ServerSession {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	return ss
}
