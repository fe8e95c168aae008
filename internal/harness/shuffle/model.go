package shuffle

import (
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/mcpsync/mcpsync"
)

// opKind is a ledger call the harness makes.
type opKind uint8

const (
	opAllocate opKind = iota
	opAccept
	opNotFound
	opBeginUnsubscribe
	opComplete
	opUnknown
	opOpenSession
	opCloseSession
	opBeginSubscribe
	opActivate
	opRestore
	opMarkRR
	opEnsure
	opNotify
	opRevoke
	opGrant
	opConfirmTombstone
)

var opNames = [...]string{"allocate", "accept", "not-found", "begin-unsubscribe", "complete-unsubscribe",
	"unsubscribe-unknown", "open-session", "close-session", "begin-subscribe", "activate", "restore", "mark-rr", "ensure",
	"notify", "revoke", "grant", "confirm-tombstone"}

func (k opKind) String() string { return opNames[k] }

// opInput is one call as the harness made it.
type opInput struct {
	kind      opKind
	gen, sgen int64
	ord       int64
	req       string
	digest    string
	epoch     int64
	wrongURI  bool  // allocate, accept, not-found: the call names a URI the subscription is not for
	seq       int64 // notify: the host's sequence number on session sgen
}

func (in opInput) String() string {
	switch in.kind {
	case opAllocate:
		return fmt.Sprintf("allocate(g%d s%d %s wrongURI=%v)", in.gen, in.sgen, in.req, in.wrongURI)
	case opAccept:
		return fmt.Sprintf("accept(g%d s%d #%d %s %.13s wrongURI=%v)", in.gen, in.sgen, in.ord, in.req, in.digest, in.wrongURI)
	case opNotFound:
		return fmt.Sprintf("not-found(g%d s%d #%d %s wrongURI=%v)", in.gen, in.sgen, in.ord, in.req, in.wrongURI)
	case opNotify:
		return fmt.Sprintf("notify(s%d #%d)", in.sgen, in.seq)
	case opRevoke, opGrant:
		return in.kind.String()
	case opConfirmTombstone:
		return fmt.Sprintf("confirm-tombstone(g%d s%d issued-before-scan %d)", in.gen, in.sgen, in.ord)
	case opComplete, opUnknown:
		return fmt.Sprintf("%s(g%d e%d)", in.kind, in.gen, in.epoch)
	case opCloseSession:
		return fmt.Sprintf("close-session(s%d)", in.sgen)
	default:
		return fmt.Sprintf("%s(g%d s%d)", in.kind, in.gen, in.sgen)
	}
}

// opOutput is what the ledger answered.
type opOutput struct {
	outcome mcpsync.Outcome
	ord     int64 // allocate: the ordinal; begin-unsubscribe: the close ordinal
	epoch   int64 // begin-unsubscribe: the close epoch
	gen     int64 // open-session: the new session generation; ensure, notify: the subscription generation
	targets int   // notify: how many subscriptions the notification is routed to
}

// class reduces an outcome to what the model predicts exactly: whether the call changed the
// ledger (applied), found it already changed (done), or was refused. Refusal labels are
// written after the fence refused, from a later read, so only the class is compared.
type class uint8

const (
	refused class = iota
	done
	applied
)

func classOf(kind opKind, o mcpsync.Outcome) class {
	switch o {
	case mcpsync.OutcomeAllocated, mcpsync.OutcomeAccepted, mcpsync.OutcomeRevalidated, mcpsync.OutcomeTombstonePending, mcpsync.OutcomeTransitioned:
		return applied
	case mcpsync.OutcomeAlreadyDone:
		if kind == opAllocate || kind == opAccept || kind == opNotFound {
			return refused
		}
		return done
	}
	return refused
}

// mDispatch is a dispatch in the model.
type mDispatch struct {
	gen, sgen int64
	req       string
	answered  bool
}

// mFirst is the first outcome recorded under an idempotency key.
type mFirst struct {
	cls     class
	outcome mcpsync.Outcome // for applied answers: Accepted or Revalidated
	ord     int64
	epoch   int64
}

// mState is the sequential model of one subscription and its source: the ledger's fences
// written as plain Go. Values are never modified after Step returns them.
type mState struct {
	state           mcpsync.State
	gen, sgen       int64
	srcGen          int64
	live            bool
	issued, wm      int64
	epoch, closeOrd int64
	digest          string
	revoked         bool              // the principal's grant on the source is revoked
	ngen, nseq      int64             // the last notification recorded on the row (session, sequence)
	disp            []mDispatch       // ordinal i+1
	first           map[string]mFirst // idempotency key -> first outcome
}

func (m mState) clone() mState {
	m.disp = slices.Clone(m.disp)
	m.first = maps.Clone(m.first)
	return m
}

func closing(s mcpsync.State) bool { return s.Closing() }

// fenceSessions applies the session fence of OpenSession and CloseSession: everything bound to
// a session generation below `below` leaves the states that session could change.
func (m *mState) fenceSessions(below int64) {
	if m.sgen >= below {
		return
	}
	switch m.state {
	case mcpsync.StateSubscribing, mcpsync.StateActive, mcpsync.StateTombstonePending:
		m.state = mcpsync.StateReconciliationRequired
	case mcpsync.StateUnsubscribing, mcpsync.StateUnsubscribeUnknown:
		m.state = mcpsync.StateClosed
	}
}

// step is the model's transition function: whether the ledger may have answered in with out
// from state m, and the state afterwards.
func step(m mState, in opInput, out opOutput) (bool, mState) {
	cls := classOf(in.kind, out.outcome)
	n := m.clone()
	switch in.kind {
	case opAllocate:
		key := "allocate/" + in.req
		if f, ok := m.first[key]; ok {
			return f.cls == cls && (cls != applied || f.ord == out.ord), m
		}
		if m.state == mcpsync.StateActive && in.gen == m.gen && in.sgen == m.sgen && in.sgen == m.srcGen && !in.wrongURI && !m.revoked {
			n.issued++
			n.disp = append(n.disp, mDispatch{gen: in.gen, sgen: in.sgen, req: in.req})
			n.first[key] = mFirst{cls: applied, ord: n.issued}
			return cls == applied && out.ord == n.issued, n
		}
		n.first[key] = mFirst{cls: refused}
		return cls == refused, n

	case opAccept, opNotFound:
		key := fmt.Sprintf("%d/%d/%s/%s", in.kind, in.ord, in.req, in.digest)
		if f, ok := m.first[key]; ok {
			return f.cls == cls && (cls != applied || f.outcome == out.outcome), m
		}
		var d *mDispatch
		if in.ord >= 1 && in.ord <= int64(len(n.disp)) {
			if x := &n.disp[in.ord-1]; x.req == in.req && x.gen == in.gen && x.sgen == in.sgen && !in.wrongURI {
				d = x
			}
		}
		if m.state == mcpsync.StateActive && in.gen == m.gen && in.sgen == m.sgen && d != nil && !d.answered && m.wm < in.ord && !m.revoked {
			d.answered = true
			n.wm = in.ord
			want := mcpsync.OutcomeTombstonePending
			if in.kind == opAccept {
				want = mcpsync.OutcomeAccepted
				if in.digest == m.digest {
					want = mcpsync.OutcomeRevalidated
				}
				n.digest = in.digest
			} else {
				n.state = mcpsync.StateTombstonePending
			}
			n.first[key] = mFirst{cls: applied, outcome: want}
			return out.outcome == want, n
		}
		if d != nil {
			d.answered = true // a refused answer settles its dispatch
		}
		n.first[key] = mFirst{cls: refused}
		return cls == refused, n

	case opBeginUnsubscribe:
		key := fmt.Sprintf("close/%d", in.gen)
		if f, ok := m.first[key]; ok {
			return f.cls == cls && (cls != applied || (f.ord == out.ord && f.epoch == out.epoch)), m
		}
		switch {
		case in.gen == m.gen && !closing(m.state):
			n.state, n.closeOrd, n.epoch = mcpsync.StateUnsubscribing, m.issued, m.epoch+1
			n.first[key] = mFirst{cls: applied, ord: n.closeOrd, epoch: n.epoch}
			return cls == applied && out.ord == n.closeOrd && out.epoch == n.epoch, n
		case in.gen > m.gen:
			return cls == refused, m // never issued: refused without a record
		}
		n.first[key] = mFirst{cls: refused}
		return cls == refused, n

	case opComplete, opUnknown:
		key := fmt.Sprintf("%d/%d/%d", in.kind, in.gen, in.epoch)
		if f, ok := m.first[key]; ok {
			return f.cls == cls, m
		}
		target, from := mcpsync.StateClosed, []mcpsync.State{mcpsync.StateUnsubscribing, mcpsync.StateUnsubscribeUnknown}
		if in.kind == opUnknown {
			target, from = mcpsync.StateUnsubscribeUnknown, []mcpsync.State{mcpsync.StateUnsubscribing}
		}
		var c class
		switch {
		case in.gen == m.gen && in.epoch == m.epoch && slices.Contains(from, m.state):
			n.state, c = target, applied
		case in.gen > m.gen || (in.gen == m.gen && in.epoch > m.epoch):
			return cls == refused, m // never issued: refused without a record
		case in.gen == m.gen && in.epoch == m.epoch && m.state == target:
			c = done
		default:
			c = refused
		}
		n.first[key] = mFirst{cls: c}
		return cls == c, n

	case opOpenSession:
		n.srcGen++
		n.live = true
		n.fenceSessions(n.srcGen)
		return out.gen == n.srcGen, n

	case opCloseSession:
		switch {
		case in.sgen == m.srcGen && m.live:
			n.live = false
			n.fenceSessions(in.sgen + 1)
			return cls == applied, n
		case in.sgen == m.srcGen:
			return cls == done, m
		}
		return cls == refused, m

	case opBeginSubscribe, opActivate, opRestore, opMarkRR:
		return stepTransition(m, n, in, cls)

	case opEnsure:
		if m.revoked {
			return cls == refused, m // no standing grant: nothing is (re)opened (R23)
		}
		if m.state == mcpsync.StateClosed {
			n.gen++
			n.state, n.sgen, n.closeOrd = mcpsync.StateDiscovered, 0, 0
			n.digest = "" // a new generation's first good read is a new version (R21)
		}
		return out.gen == n.gen, n

	case opNotify:
		// RecordNotification routes to the subscription only from the source's current
		// session, while it is not closing, and never backwards; an equal pair is a retry of
		// the same notification and is routed again (R12, R19).
		// Its statement checks the source's session in its snapshot, not as locked: one that
		// waited on the subscription row while a new session opened is routed still, so a
		// notification of a superseded session may be routed or not.
		if in.sgen <= m.srcGen && !closing(m.state) && (m.ngen < in.sgen || (m.ngen == in.sgen && m.nseq <= in.seq)) {
			if in.sgen < m.srcGen && out.targets == 0 {
				return true, m
			}
			n.ngen, n.nseq = in.sgen, in.seq
			return out.targets == 1 && out.gen == m.gen, n
		}
		return out.targets == 0, m

	case opRevoke:
		n.revoked = true
		return true, n

	case opGrant:
		n.revoked = false
		return true, n

	case opConfirmTombstone:
		// The catalog was scanned on session in.sgen after ordinals 1..in.ord were issued. The
		// fence holds for a pending tombstone of this generation on that session; whether a
		// not-found read issued later than in.ord was dispatched before the scan began is not
		// known to the harness, so then either answer is allowed.
		if m.state == mcpsync.StateTombstonePending && in.gen == m.gen && in.sgen == m.sgen {
			if cls == applied {
				n.state, n.closeOrd, n.epoch = mcpsync.StateUnsubscribing, m.issued, m.epoch+1
				n.digest = "" // the latest version is the tombstone (R21)
				return true, n
			}
			return m.wm > in.ord && cls == refused, m
		}
		return cls == refused, m
	}
	return false, m
}

// stepTransition models the unkeyed transitions: applied when the fence holds; otherwise
// OLD_GENERATION / OLD_SESSION / REFUSED (class refused) or ALREADY_DONE (class done), in the
// ledger's order of classification. Nothing is recorded for them.
func stepTransition(m, n mState, in opInput, cls class) (bool, mState) {
	var target mcpsync.State
	ok := false
	switch in.kind {
	case opBeginSubscribe:
		target = mcpsync.StateSubscribing
		ok = m.live && in.sgen == m.srcGen && in.gen == m.gen && m.sgen <= in.sgen &&
			(m.state == mcpsync.StateDiscovered || m.state == mcpsync.StateReconciliationRequired ||
				(m.state == mcpsync.StateSubscribing && m.sgen < in.sgen))
		if ok {
			n.state, n.sgen = target, in.sgen
		}
	case opActivate:
		target = mcpsync.StateActive
		ok = m.live && in.sgen == m.srcGen && in.gen == m.gen && m.sgen == in.sgen && m.state == mcpsync.StateSubscribing
	case opRestore:
		target = mcpsync.StateActive
		ok = m.live && in.sgen == m.srcGen && in.gen == m.gen && m.sgen == in.sgen && m.state == mcpsync.StateTombstonePending
	case opMarkRR:
		target = mcpsync.StateReconciliationRequired
		ok = in.gen == m.gen && (m.state == mcpsync.StateDiscovered || m.state == mcpsync.StateSubscribing ||
			m.state == mcpsync.StateActive || m.state == mcpsync.StateTombstonePending)
	}
	if ok {
		n.state = target
		return cls == applied, n
	}
	c := refused
	switch {
	case in.gen != m.gen:
	case in.sgen > 0 && in.sgen < m.srcGen:
	case m.state == target && (in.sgen == 0 || in.sgen == m.sgen):
		c = done
	}
	return cls == c, m
}

// model is the porcupine model of one interleaving, starting from the state setup leaves: an
// ACTIVE subscription of generation 1 on the source's first, live session.
func model() porcupine.Model {
	return porcupine.Model{
		Init: func() any {
			return mState{state: mcpsync.StateActive, gen: 1, sgen: 1, srcGen: 1, live: true, first: map[string]mFirst{}}
		},
		Step: func(state, input, output any) (bool, any) {
			return step(state.(mState), input.(opInput), output.(opOutput))
		},
		Equal: func(a, b any) bool { return reflect.DeepEqual(a, b) },
		DescribeOperation: func(input, output any) string {
			out := output.(opOutput)
			return fmt.Sprintf("%s -> %s %d/%d/%d", input.(opInput), out.outcome, out.ord, out.epoch, out.gen)
		},
		DescribeState: func(state any) string {
			m := state.(mState)
			return fmt.Sprintf("%s g%d s%d src%d live=%v issued=%d wm=%d epoch=%d", m.state, m.gen, m.sgen, m.srcGen, m.live, m.issued, m.wm, m.epoch)
		},
	}
}

// linearizabilityTimeout bounds porcupine's search per interleaving.
const linearizabilityTimeout = 10 * time.Second

// checkLinearizable checks the interleaving's call history against the model.
func (iv *interleaving) checkLinearizable() []Violation {
	res, info := porcupine.CheckOperationsVerbose(model(), iv.history, linearizabilityTimeout)
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		return []Violation{iv.violation(kindLinearizabilityUnk, fmt.Sprintf("porcupine gave up after %s on %d operations", linearizabilityTimeout, len(iv.history)))}
	}
	detail := fmt.Sprintf("no sequential execution of the ledger model explains these %d calls", len(iv.history))
	// MCPSYNC_SHUFFLE_DEBUG=1 prints the history, in call order, for a replay to read.
	if os.Getenv("MCPSYNC_SHUFFLE_DEBUG") != "" {
		h := slices.Clone(iv.history)
		slices.SortFunc(h, func(a, b porcupine.Operation) int { return int(a.Call - b.Call) })
		for _, op := range h {
			fmt.Fprintf(os.Stderr, "%d [%d,%d] %s\n", op.ClientId, op.Call/1000, op.Return/1000, model().DescribeOperation(op.Input, op.Output))
		}
	}
	if partial := info.PartialLinearizations(); len(partial) > 0 && len(partial[0]) > 0 {
		longest := partial[0][0]
		for _, p := range partial[0] {
			if len(p) > len(longest) {
				longest = p
			}
		}
		detail += fmt.Sprintf("; the longest linearizable prefix covers %d of them", len(longest))
	}
	return []Violation{iv.violation(kindNonLinearizable, detail)}
}
