package ledger

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Leases (issue 12, defect 6). A source's session lives on the one host that holds the
// source's lease (sources.host_queue, sources.lease_until). A host takes and renews its leases
// only through ClaimLeases, one transaction that is the fence: it renews the host's heartbeat
// in hosts, renews the leases the host holds, takes free or expired sources up to the host's
// fair share, and names the sources the host holds above its share, to be shed. A lease
// changes hands only when it expired or its holder released it (ReleaseSource) after closing
// its session, so two hosts never hold one source at once; OpenSession opens a generation
// only under an unexpired lease.

// LeaseRound is what one ClaimLeases round gives a host.
type LeaseRound struct {
	// Held are the sources the host holds and keeps, sorted by name; their leases run until
	// LeaseUntil.
	Held []Source
	// Shed are sources the host still holds but must give up: it closes their sessions and
	// then calls ReleaseSource. Sources above the host's fair share are shed a few per round
	// (at most ShedPerRound), their leases renewed meanwhile so that they cannot expire
	// before the session is closed; removed sources always, without renewal (nobody takes a
	// removed source).
	Shed []Source
	// Now is the database's time of the round; LeaseUntil is when the renewed leases and the
	// host's heartbeat expire, on the database's clock (Now + lease).
	Now, LeaseUntil time.Time
	// LiveHosts is the number of hosts whose heartbeat had not expired, this one included;
	// Share is the fair share: ceil(active sources / LiveHosts).
	LiveHosts, Share int
}

// ShedPerRound is the most sources above its share a host is asked to shed in one round:
// a quarter of its share, at least one, so that work moves to a newly started host in a few
// rounds without every session of an overloaded host restarting at once.
func ShedPerRound(share int) int { return max(1, (share+3)/4) }

// hostGrace is how long an expired hosts row is kept before a claim round deletes it.
const hostGrace = 10 * time.Minute

// ClaimLeases runs one lease round for hostQueue, in one transaction: it renews the host's
// heartbeat for lease; counts the live hosts and the active (not removed) sources; renews
// every lease the host holds on an active source; takes free or expired active sources,
// lowest id first and skipping rows other rounds have locked, until it holds its fair share
// (rows are taken FOR NO KEY UPDATE, the lock the lease's UPDATE needs: a subscription being
// created holds its source FOR KEY SHARE and must not make a round skip the source);
// and, when it holds more than its share, names the highest-id ones (at most ShedPerRound)
// in Shed, with every removed source it holds (those are not renewed). A source is taken only
// if no host holds it or its lease expired, and renewed only while hostQueue still holds it,
// both in the WHERE of the statement that writes it, so no two hosts ever hold one lease.
func (s *Store) ClaimLeases(ctx context.Context, hostQueue string, lease time.Duration) (LeaseRound, error) {
	if strings.TrimSpace(hostQueue) == "" || lease <= 0 {
		return LeaseRound{}, fmt.Errorf("ledger: claim leases: host queue %q, lease %s: %w", hostQueue, lease, ErrInvalid)
	}
	secs := lease.Seconds()
	var r LeaseRound
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		r = LeaseRound{}
		if err := tx.QueryRow(ctx, `INSERT INTO hosts (queue, alive_until)
			VALUES ($1, now() + make_interval(secs => $2))
			ON CONFLICT (queue) DO UPDATE SET alive_until = EXCLUDED.alive_until
			RETURNING now(), alive_until`, hostQueue, secs).Scan(&r.Now, &r.LeaseUntil); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM hosts WHERE queue IN (
				SELECT queue FROM hosts WHERE alive_until < now() - make_interval(secs => $1)
				FOR UPDATE SKIP LOCKED)`, hostGrace.Seconds()); err != nil {
			return fmt.Errorf("forget dead hosts: %w", err)
		}
		var active int
		if err := tx.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM hosts WHERE alive_until > now()),
				(SELECT count(*) FROM sources WHERE removed_at IS NULL)`).Scan(&r.LiveHosts, &active); err != nil {
			return fmt.Errorf("count hosts and sources: %w", err)
		}
		r.LiveHosts = max(r.LiveHosts, 1) // this host's heartbeat is live
		r.Share = (active + r.LiveHosts - 1) / r.LiveHosts
		held, err := collectSources(tx.Query(ctx, `UPDATE sources SET lease_until = now() + make_interval(secs => $2)
			WHERE host_queue = $1 AND removed_at IS NULL
			RETURNING `+sourceColumns, hostQueue, secs))
		if err != nil {
			return fmt.Errorf("renew: %w", err)
		}
		if want := r.Share - len(held); want > 0 {
			taken, err := collectSources(tx.Query(ctx, `UPDATE sources
				SET host_queue = $1, lease_until = now() + make_interval(secs => $2)
				WHERE id IN (SELECT id FROM sources
				             WHERE removed_at IS NULL
				               AND (host_queue IS NULL OR lease_until IS NULL OR lease_until <= now())
				             ORDER BY id LIMIT $3 FOR NO KEY UPDATE SKIP LOCKED)
				  AND removed_at IS NULL
				  AND (host_queue IS NULL OR lease_until IS NULL OR lease_until <= now())
				RETURNING `+sourceColumns, hostQueue, secs, want))
			if err != nil {
				return fmt.Errorf("take: %w", err)
			}
			held = append(held, taken...)
		}
		slices.SortFunc(held, func(a, b Source) int { return cmp.Compare(a.ID, b.ID) })
		if over := len(held) - r.Share; over > 0 {
			n := min(over, ShedPerRound(r.Share))
			r.Shed = append(r.Shed, held[len(held)-n:]...)
			held = held[:len(held)-n]
		}
		r.Held = held
		removed, err := collectSources(tx.Query(ctx, `SELECT `+sourceColumns+` FROM sources
			WHERE host_queue = $1 AND removed_at IS NOT NULL ORDER BY id`, hostQueue))
		if err != nil {
			return fmt.Errorf("removed sources: %w", err)
		}
		r.Shed = append(r.Shed, removed...)
		return nil
	})
	if err != nil {
		return LeaseRound{}, fmt.Errorf("ledger: claim leases for %s: %w", hostQueue, err)
	}
	byName := func(a, b Source) int { return strings.Compare(a.Name, b.Name) }
	slices.SortFunc(r.Held, byName)
	slices.SortFunc(r.Shed, byName)
	return r, nil
}

// ClaimSources runs one lease round (ClaimLeases) and returns the sources hostQueue holds and
// keeps, sorted by name. Sources it should shed are left out (and stay held until released or
// expired); a host alone holds every active source.
func (s *Store) ClaimSources(ctx context.Context, hostQueue string, lease time.Duration) ([]Source, error) {
	r, err := s.ClaimLeases(ctx, hostQueue, lease)
	if err != nil {
		return nil, err
	}
	return r.Held, nil
}

// ReleaseSource gives up hostQueue's lease on a source, so another host can take it at once.
// The host calls it only after the source's session ended (on shutdown or when shedding), so
// the source is never live on two hosts. Releasing a lease the host does not hold does
// nothing.
func (s *Store) ReleaseSource(ctx context.Context, sourceID int64, hostQueue string) error {
	_, err := s.pool.Exec(ctx, `UPDATE sources SET lease_until = NULL, host_queue = NULL
		WHERE id = $1 AND host_queue = $2`, sourceID, hostQueue)
	if err != nil {
		return fmt.Errorf("ledger: release source %d: %w", sourceID, err)
	}
	return nil
}

// RetireHost deletes hostQueue's heartbeat, so that the other hosts' shares grow at their next
// round instead of when the heartbeat expires. A host calls it when it stops, after releasing
// its sources; a later ClaimLeases registers it again.
func (s *Store) RetireHost(ctx context.Context, hostQueue string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM hosts WHERE queue = $1`, hostQueue); err != nil {
		return fmt.Errorf("ledger: retire host %s: %w", hostQueue, err)
	}
	return nil
}

// collectSources scans the rows of a query selecting sourceColumns.
func collectSources(rows pgx.Rows, err error) ([]Source, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Source, error) { return scanSource(r) })
}
