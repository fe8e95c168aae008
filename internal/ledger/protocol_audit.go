package ledger

import (
	"context"
	"fmt"

	"github.com/mcpsync/mcpsync"
)

// ReceiptProtocolError is the audit receipt of an answer that breaks the MCP revision the
// session negotiated (issue 13 item 6: a 2026-07-28 server answering a resources/read with
// empty contents instead of -32602). Such an answer is never accepted as a version.
const ReceiptProtocolError mcpsync.ReceiptKind = "PROTOCOL_ERROR"

// ProtocolViolation is one answer that broke the negotiated revision: the source, the session
// generation it arrived on, a per-session sequence number (the idempotency of the audit), the
// method, the URI asked for, the revision and what was wrong.
type ProtocolViolation struct {
	SourceID          int64
	SessionGeneration int64
	Seq               int64
	Method            string
	URI               string
	Protocol          string
	Problem           string
}

// auditProtocolFmt is the idempotency key of a protocol violation's receipt.
const auditProtocolFmt = "protocol/%d/%d/%d"

// AuditProtocolViolation records a protocol violation as one PROTOCOL_ERROR receipt; a retry
// of the same (source, session generation, sequence number) records nothing new.
func (s *Store) AuditProtocolViolation(ctx context.Context, v ProtocolViolation) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO receipts (idem_key, kind, source_id, session_generation, uri, detail)
		VALUES ($1, $2, $3, $4, $5, jsonb_build_object('method', $6::text, 'protocol', $7::text, 'problem', $8::text))
		ON CONFLICT (idem_key) DO NOTHING`,
		fmt.Sprintf(auditProtocolFmt, v.SourceID, v.SessionGeneration, v.Seq), ReceiptProtocolError,
		v.SourceID, v.SessionGeneration, SafeText(Bounded(v.URI, MaxPayloadString)), SafeText(v.Method),
		SafeText(v.Protocol), SafeText(v.Problem))
	if err != nil {
		return fmt.Errorf("ledger: audit protocol violation: %w", err)
	}
	return nil
}
