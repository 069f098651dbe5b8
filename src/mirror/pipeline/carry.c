/* Carried transactions: a partition's destination transactional producers, the fence, ListTransactions, markers. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/list_transactions_request.h"
#include "kmirror/msg/list_transactions_response.h"
#include "kmirror/rpc.h"
#include "mirror/pipeline/pipeline.h"

/* ---- transactions: the partition's destination transactional producers ---- */

/* kmirror/<instance>/<mirror>/<topic>/<partition>/<k>: a transactional id carries one partition's transactions. */
static void tid_of(const km_pipeline *pl, const mpart *p, size_t k, char *buf, size_t len)
{
	snprintf(buf, len, "kmirror/%s/%s/%s/%d/%zu", km_mirror_get_opts(pl->mi)->instance, pl->name, p->t->name,
		 (int)p->id, k);
}

/* Whether tid is one of p's, of any kmirrord instance (another may have run the mirror before). */
bool km_pl_tid_is_of(const km_pipeline *pl, const mpart *p, const char *tid)
{
	char mid[600];
	const char *at;
	snprintf(mid, sizeof(mid), "/%s/%s/%d/", pl->name, p->t->name, (int)p->id);
	if (strncmp(tid, "kmirror/", 8) || !(at = strstr(tid + 8, mid)))
		return false;
	at += strlen(mid);
	if (!*at)
		return false;
	while (*at >= '0' && *at <= '9')
		at++;
	return !*at;
}

bool km_pl_tid_held(const mpart *p, const char *tid)
{
	for (size_t k = 0; k < p->txn.n; k++)
		if (!strcmp(km_txp_id(p->txn.tx[k].txp), tid))
			return true;
	return false;
}

static bool tx_add(km_pipeline *pl, mpart *p, const char *tid)
{
	mtx *n = realloc(p->txn.tx, (p->txn.n + 1) * sizeof(*n));
	km_txp *t;
	if (!n)
		return false;
	p->txn.tx = n;
	if (!(t = km_txp_new(pl->dst, tid, p->t->name, p->id, km_pl_on_cluster_change, pl)))
		return false;
	p->txn.tx[p->txn.n++] = (mtx){.txp = t, .src_pid = -1, .first_logical = -1, .marker_phys = -1};
	return true;
}

/*
 * The producer carrying source producer src_pid's open transaction on p (one whose marker is
 * planned is not: that transaction is over); a free one (or a new one) when create. Of the free
 * ones, the one whose last transaction ended first. The coordinator refuses a new transaction of
 * a producer until it has completed the last one (CONCURRENT_TRANSACTIONS, for some tens of ms
 * after the marker landed): while the pool is small, a new producer rather than one just freed.
 */
static int lease_for(km_pipeline *pl, mpart *p, int64_t src_pid, bool create)
{
	char tid[700];
	int pick = -1;
	for (size_t i = 0; i < p->txn.n; i++)
		if (p->txn.tx[i].src_pid == src_pid && !p->txn.tx[i].marked)
			return (int)i;
	if (!create)
		return -1;
	for (size_t i = 0; i < p->txn.n; i++)
		if (p->txn.tx[i].src_pid < 0 && km_txp_state_of(p->txn.tx[i].txp) <= KM_TXP_FREE &&
		    (pick < 0 || p->txn.tx[i].released < p->txn.tx[pick].released))
			pick = (int)i;
	if (pick >= 0 && (p->txn.n >= TXN_POOL_WARM ||
			  km_wall_ms() - p->txn.tx[pick].released >= TXN_COMPLETE_MS)) {
		p->txn.tx[pick].src_pid = src_pid;
		return pick;
	}
	for (size_t k = p->txn.n;; k++) {
		tid_of(pl, p, k, tid, sizeof(tid));
		if (!km_pl_tid_held(p, tid))
			break;
	}
	if (!tx_add(pl, p, tid))
		return -1;
	p->txn.tx[p->txn.n - 1].src_pid = src_pid;
	return (int)p->txn.n - 1;
}

static void publish_open(km_pipeline *pl, mpart *p);

/* The batch plan's transactions (mplan_env.txn): arg is the partition. */
int km_pl_txn_slot(void *arg, int64_t src_pid, int64_t logical, mtx_use use)
{
	mpart *p = arg;
	km_pipeline *pl = p->t->pl;
	int i = lease_for(pl, p, src_pid, use == MTX_BATCH);
	if (i >= 0 && use == MTX_MARKER) {
		/*
		 * A source producer has one transaction open at a time: another of its producers still
		 * open here would never see its marker, and hold the partition's LSO back for good.
		 * Reconcile fences it and mirrors its records again (step_part, machine.c).
		 */
		for (size_t j = 0; j < p->txn.n; j++)
			if ((int)j != i && p->txn.tx[j].src_pid == src_pid && !p->txn.tx[j].marked)
				p->txn.orphan = true;
		p->txn.tx[i].marked = true;
	}
	if (i >= 0 && use == MTX_BATCH && p->txn.tx[i].first_logical < 0) {
		p->txn.tx[i].first_logical = logical;
		publish_open(pl, p);
	}
	return i;
}

bool km_pl_tx_open(const mpart *p)
{
	for (size_t i = 0; i < p->txn.n; i++)
		if (p->txn.tx[i].src_pid >= 0)
			return true;
	return false;
}

int64_t km_pl_open_txn_logical(const mpart *p)
{
	int64_t first = -1;
	for (size_t i = 0; i < p->txn.n; i++)
		if (p->txn.tx[i].src_pid >= 0 && p->txn.tx[i].first_logical >= 0 &&
		    (first < 0 || p->txn.tx[i].first_logical < first))
			first = p->txn.tx[i].first_logical;
	return first;
}

/* Describe's figure: where the earliest open destination transaction of p starts (offmap.open_txn_logical). */
static void publish_open(km_pipeline *pl, mpart *p)
{
	km_offmap *m = km_state_offmap_mut(km_mirror_store(pl->mi), p->t->name, p->id);
	if (m)
		m->open_txn_logical = km_pl_open_txn_logical(p);
}

/* The source transaction p->txn.tx[i] carried is decided (or aborted by a fence): the producer is free. */
static void tx_release(km_pipeline *pl, mpart *p, size_t i)
{
	p->txn.tx[i].src_pid = -1;
	p->txn.tx[i].begun = false;
	p->txn.tx[i].marked = false;
	p->txn.tx[i].first_logical = -1;
	p->txn.tx[i].marker_phys = -1;
	p->txn.tx[i].released = km_wall_ms();
	publish_open(pl, p);
}

/*
 * Transactions this life ended (EndTxn sent, the source's marker mirrored) are decided by the
 * coordinator, whatever the partition's leader did meanwhile: once EndTxn is answered their marker
 * lands, or has landed, at the log's end, and what they hold is committed (or aborted) as the
 * source's. Reconcile does not count them open, so nothing committed is hidden and written again
 * (docs/reliability.md, finding 20). It waits for EndTxn's answer (a fence would drop it) and for
 * the marker (the destination's log past where it was planned; the last stable offset may stay
 * below it for another transaction still open), at most ENDED_WAIT_MS; then the fence decides, as
 * for any transaction left open. True while it waits.
 */
bool km_pl_tx_wait_ended(km_pipeline *pl, mpart *p, int64_t end)
{
	int64_t now = km_wall_ms();
	bool wait = false;
	char tag[300];

	for (size_t i = 0; i < p->txn.n; i++) {
		mtx *x = &p->txn.tx[i];
		km_txp_state st = km_txp_state_of(x->txp);
		if (x->src_pid < 0 || x->marker_phys < 0 || (st != KM_TXP_ENDING && st != KM_TXP_FREE))
			continue;
		if (st == KM_TXP_FREE && end > x->marker_phys)
			tx_release(pl, p, i); /* answered, its marker in */
		else
			wait = true;
	}
	if (!wait) {
		p->recon.ended_wait = 0;
		return false;
	}
	if (!p->recon.ended_wait)
		p->recon.ended_wait = now;
	if (now - p->recon.ended_wait < ENDED_WAIT_MS)
		return true;
	p->recon.ended_wait = 0;
	KM_WARN(COMP, 0, "%s/%s: a transaction this kmirrord ended has no answer or no marker after %d s: the fence "
		"decides it, and what it holds is mirrored again", pl->name, km_pl_ptag(p, tag, sizeof(tag)),
		ENDED_WAIT_MS / 1000);
	return false;
}

void km_pl_tx_free_all(mpart *p)
{
	for (size_t i = 0; i < p->txn.n; i++)
		km_txp_free(p->txn.tx[i].txp);
	free(p->txn.tx);
	p->txn.tx = NULL;
	p->txn.n = 0;
}

/*
 * The coordinator aborts a fenced transaction by writing its marker into each of its partitions
 * through that partition's leader, and skips a partition that has none at that moment ("likely
 * deleted already"): offline, its only replica's broker down. The transaction then stays open on
 * that partition, holding its last stable offset, until the same producer's next marker there,
 * which commits what it held (docs/reliability.md, finding 4). Each of the partition's ids begins
 * a transaction on it (AddPartitionsToTxn) and aborts it with nothing written: the coordinator
 * writes that abort's marker, which closes whatever the id's producer left open there. True once
 * every id is free again.
 */
static bool close_hanging(km_pipeline *pl, mpart *p)
{
	bool done = true;

	for (size_t i = 0; i < p->txn.n; i++) {
		mtx *x = &p->txn.tx[i];
		km_txp_state st = km_txp_state_of(x->txp);
		if (st == KM_TXP_FAILED) {
			km_pl_fail_part(pl, p, km_txp_error(x->txp));
			p->recon.hang_closing = false;
			return false;
		}
		if (x->hang == 0 && st == KM_TXP_FREE) {
			km_txp_begin(x->txp);
			x->hang = 1;
		} else if (x->hang == 1 && st == KM_TXP_OPEN) {
			km_txp_end(x->txp, false);
			x->hang = 2;
		}
		done &= x->hang == 2 && st == KM_TXP_FREE;
	}
	if (!done)
		return false;
	for (size_t i = 0; i < p->txn.n; i++)
		p->txn.tx[i].hang = 0;
	p->recon.hang_closing = false;
	p->recon.hang_closed = true;
	return true;
}

/*
 * Fence p's transactional ids: every one of its own and every one an earlier life left (listed by
 * ListTransactions) is initialised again, which aborts what it held open and moves its epoch on.
 * True once all are free again. When reconcile finds a transaction still open after the fence,
 * the ids close it here first (close_hanging).
 */
bool km_pl_fence_done(km_pipeline *pl, mpart *p)
{
	char tag[300];
	if (p->recon.hang_closing)
		return close_hanging(pl, p);
	if (!p->recon.fence_started) {
		for (size_t i = 0; i < pl->nlisted && !p->recon.tx_fenced; i++)
			if (km_pl_tid_is_of(pl, p, pl->listed[i]) && !km_pl_tid_held(p, pl->listed[i]) &&
			    !tx_add(pl, p, pl->listed[i]))
				return false;
		for (size_t i = 0; i < p->txn.n; i++) {
			km_txp_fence(p->txn.tx[i].txp);
			tx_release(pl, p, i);
		}
		if (p->txn.n)
			KM_INFO(COMP, 0, "%s/%s: fencing %zu transactional id(s): what they held open is aborted", pl->name,
				km_pl_ptag(p, tag, sizeof(tag)), p->txn.n);
		p->recon.fence_started = true;
	}
	for (size_t i = 0; i < p->txn.n; i++) {
		km_txp_state st = km_txp_state_of(p->txn.tx[i].txp);
		if (st == KM_TXP_FAILED) {
			km_pl_fail_part(pl, p, km_txp_error(p->txn.tx[i].txp));
			p->recon.fence_started = false;
			return false;
		}
		if (st != KM_TXP_FREE)
			return false;
	}
	p->recon.fence_started = false;
	p->recon.tx_fenced = true;
	return true;
}

/* ---- ListTransactions: the transactional ids earlier lives of the mirror left on the destination ---- */

static void on_list_txns(km_net_client *c, const km_rpc_response *res, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	const km_list_transactions_response *r = res->msg;
	km_err err = km_rpc_transport_err(res);
	char mid[300];
	bool ok = false;

	if (pl->closing || pl->txl != TXL_ASKED || (uintptr_t)x->extra != pl->txl_gen) {
		free(x);
		return;
	}
	free(x);
	snprintf(mid, sizeof(mid), "/%s/", pl->name);
	if (err == KM_OK) {
		if (r && !r->error_code) {
			ok = true;
			for (int32_t i = 0; i < r->transaction_states.count; i++) {
				km_str id = r->transaction_states.items[i].transactional_id;
				char tid[700], **nl;
				snprintf(tid, sizeof(tid), "%.*s", id.len > 0 ? (int)id.len : 0, id.p);
				if (strncmp(tid, "kmirror/", 8) || !strstr(tid + 8, mid))
					continue;
				if (!(nl = realloc(pl->listed, (pl->nlisted + 1) * sizeof(*nl))) ||
				    !(nl[pl->nlisted] = strdup(tid))) {
					if (nl)
						pl->listed = nl;
					ok = false;
					break;
				}
				pl->listed = nl;
				pl->nlisted++;
			}
		} else if (!ok) {
			KM_WARN(COMP, 0, "%s: ListTransactions on the destination failed", pl->name);
		}
	} else {
		km_cluster_drop(pl->dst, c);
	}
	if (!ok) {
		pl->txl = TXL_UNASKED; /* asked again, from the start */
		pl->txl_at = km_wall_ms();
	} else if (--pl->txl_pending == 0) {
		pl->txl = TXL_KNOWN;
		KM_DEBUG(COMP, 0, "%s: %zu transactional id(s) of the mirror on the destination", pl->name, pl->nlisted);
	}
	km_pl_tick_soon(pl);
}

void km_pl_relist_txns(km_pipeline *pl)
{
	if (pl->txl != TXL_KNOWN)
		return; /* being asked (or the destination has no transactions) */
	pl->txl = TXL_UNASKED;
	pl->txl_at = 0;
	pl->txl_since = 0;
	km_pl_tick_soon(pl);
}

void km_pl_list_txns(km_pipeline *pl, int64_t now)
{
	int32_t nodes[256];
	size_t n = km_cluster_node_ids(pl->dst, nodes, 256);
	km_list_transactions_request m;

	if (pl->txl != TXL_UNASKED || now - pl->txl_at < 1000)
		return;
	if (!pl->txl_since)
		pl->txl_since = now;
	if (now - pl->txl_since > TXL_PATIENCE_MS) {
		/*
		 * A destination broker that stays unreachable must not hold every partition back: go on
		 * without the listing. An earlier life's transactions on a broker not listed are left to
		 * the destination's timeout (a marker landing where it was not planned is reconciled).
		 */
		KM_WARN(COMP, 0, "%s: ListTransactions did not reach every destination broker in %d s: going on "
			"without it (%s)", pl->name, TXL_PATIENCE_MS / 1000, km_cluster_last_error(pl->dst));
		pl->txl = TXL_KNOWN;
		return;
	}
	if (!n || n > 256)
		return;
	for (size_t i = 0; i < pl->nlisted; i++)
		free(pl->listed[i]);
	free(pl->listed);
	pl->listed = NULL;
	pl->nlisted = 0;
	pl->txl_pending = 0;
	pl->txl = TXL_ASKED;
	pl->txl_at = now;
	pl->txl_gen++;
	for (size_t i = 0; i < n; i++)
		if (!km_cluster_usable(pl->dst, km_cluster_node(pl->dst, nodes[i]))) {
			/* Connecting: asked again on the next tick (a client that becomes ready ticks). */
			pl->txl = TXL_UNASKED;
			pl->txl_at = 0;
			return;
		}
	for (size_t i = 0; i < n; i++) {
		req_ctx *x;
		km_net_client *c = km_cluster_node(pl->dst, nodes[i]);
		int16_t ver;
		if (!km_cluster_usable(pl->dst, c)) {
			pl->txl = TXL_UNASKED;
			return; /* asked again when all are connected; the answers of those asked are dropped */
		}
		if ((ver = km_net_version_pick(c, KM_API_LIST_TRANSACTIONS, LT_LO, LT_HI)) < 0) {
			KM_INFO(COMP, 0, "%s: the destination has no ListTransactions (before Kafka 3.0): source "
				"transactions cannot be carried", pl->name);
			pl->txl = TXL_UNSUPPORTED;
			return;
		}
		km_list_transactions_request_init(&m);
		if ((x = km_pl_ctx_new(pl, pl->dst, nodes[i], ver)))
			x->extra = (void *)pl->txl_gen;
		if (km_pl_call(c, KM_API_LIST_TRANSACTIONS, ver, &m, on_list_txns, x) != KM_OK) {
			km_cluster_drop(pl->dst, c);
			pl->txl = TXL_UNASKED;
			return;
		}
		pl->txl_pending++;
	}
}

/* ---- a transaction's marker: the destination transaction ends, its marker lands where the source's is ---- */

/*
 * p's head marker has stood MARKER_STUCK_MS: its producer never became open, or its EndTxn was
 * never answered, or its marker never landed. Nothing else would move the partition on, and its
 * destination transaction would hold readers at the LSO: what p's producers and plan hold is
 * logged, and p reconciles (which fences the producers and mirrors the open transactions again).
 */
static void stuck_marker(km_pipeline *pl, mpart *p, const mbatch *b, km_txp_state st)
{
	static const char *mk[] = {"waiting for everything before it", "EndTxn sent", "its landing asked"};
	char tag[300], why[400];
	int n = 0;

	for (const mbatch *x = p->plan.head; x; x = x->next)
		n++;
	KM_WARN(COMP, 0, "%s/%s: the %s marker at offset %lld (destination offset %lld) has stood %d s, %s, its "
		"producer %s %s; %d batch(es) planned, %zu in flight, fetch ahead %d/%d", pl->name,
		km_pl_ptag(p, tag, sizeof(tag)), b->commit ? "commit" : "abort", (long long)b->logical,
		(long long)b->physical, MARKER_STUCK_MS / 1000, b->mk <= MK_ASKED ? mk[b->mk] : "?",
		km_txp_id(p->txn.tx[b->txi].txp), km_txp_state_name(st), n, p->out.inflight, p->fetch.ahead,
		p->fetch.taken);
	for (size_t i = 0; i < p->txn.n; i++) {
		const mtx *x = &p->txn.tx[i];
		KM_WARN(COMP, 0, "%s/%s: producer %zu %s: %s, source producer %lld, begun %d, marked %d, first offset %lld, "
			"marker at destination offset %lld", pl->name, tag, i, km_txp_id(x->txp),
			km_txp_state_name(km_txp_state_of(x->txp)), (long long)x->src_pid, x->begun, x->marked,
			(long long)x->first_logical, (long long)x->marker_phys);
	}
	snprintf(why, sizeof(why), "a transaction marker stood %d s without landing", MARKER_STUCK_MS / 1000);
	km_pl_reconcile(pl, p, why);
}

/*
 * p's head is a marker and everything before it is in: end the destination transaction as the
 * source's marker says, then ask the destination's log end until the coordinator's marker is in.
 */
void km_pl_drive_marker(km_pipeline *pl, mpart *p, int64_t now, int64_t *next)
{
	mbatch *b = p->plan.head;
	km_txp *t = p->txn.tx[b->txi].txp;
	km_txp_state st = km_txp_state_of(t);

	if (st == KM_TXP_FAILED) {
		km_pl_reconcile(pl, p, km_txp_error(t));
		return;
	}
	if (!b->mk_since)
		b->mk_since = now;
	if (now - b->mk_since > MARKER_STUCK_MS) {
		stuck_marker(pl, p, b, st);
		return;
	}
	if (b->mk == MK_WAITING && st == KM_TXP_OPEN) {
		int64_t at;
		km_txp_end(t, b->commit);
		p->txn.tx[b->txi].marker_phys = b->physical;
		b->mk = MK_ENDING;
		b->mk_since = now;
		/* EndTxn goes now: the producers were polled before this step (km_pl_drive_txps). */
		if ((at = km_txp_poll(t, now)) < *next)
			*next = at;
	} else if (b->mk == MK_ENDING && st == KM_TXP_FREE) {
		if (b->mk_at > now) {
			if (b->mk_at < *next)
				*next = b->mk_at;
		} else if (km_pl_send_lo(pl, p, true, -1, LO_MARKER)) {
			b->mk = MK_ASKED;
		}
	}
}

void km_pl_marker_answer(km_pipeline *pl, mpart *p, bool ok, int64_t end, int64_t at)
{
	mbatch *b = p->plan.head;
	char tag[300];

	if (!b || b->kind != BK_MARKER || b->mk != MK_ASKED || b->physical != at)
		return; /* an answer about an earlier marker (reconciled since) */
	b->mk = MK_ENDING;
	if (!ok)
		pl->dst_meta_need = true; /* the leader may have moved */
	if (!ok || end == b->physical) {
		/* Not in yet (the coordinator writes it after EndTxn's answer): looked at again shortly. */
		b->mk_at = km_wall_ms() + (ok ? MARKER_POLL_MS : BACKOFF_MIN_MS);
		return;
	}
	if (end != b->physical + 1) {
		char why[200];
		snprintf(why, sizeof(why), "a transaction marker planned at destination offset %lld: the log ends at %lld",
			 (long long)b->physical, (long long)end);
		if (p->recon.hide_logical < 0 || b->logical < p->recon.hide_logical)
			p->recon.hide_logical = b->logical;
		km_pl_reconcile(pl, p, why);
		return;
	}
	KM_DEBUG(COMP, 0, "%s/%s: %s marker at offset %lld (destination offset %lld)", pl->name,
		 km_pl_ptag(p, tag, sizeof(tag)), b->commit ? "commit" : "abort", (long long)b->logical, (long long)b->physical);
	tx_release(pl, p, (size_t)b->txi);
	p->plan.head = b->next;
	if (!p->plan.head)
		p->plan.tail = NULL;
	km_pl_landed(pl, p, b);
	km_pl_tick_soon(pl);
}

/* The partition's producers: transactions to begin, requests to send. */
void km_pl_drive_txps(km_pipeline *pl, mpart *p, int64_t now, int64_t *next)
{
	for (size_t i = 0; i < p->txn.n; i++) {
		mtx *x = &p->txn.tx[i];
		int64_t at;
		if (x->src_pid >= 0 && !x->begun && km_txp_state_of(x->txp) == KM_TXP_FREE) {
			km_txp_begin(x->txp);
			x->begun = true;
		}
		if (x->src_pid >= 0 && km_txp_state_of(x->txp) == KM_TXP_FAILED && p->phase == PH_WRITING && !p->out.inflight)
			km_pl_reconcile(pl, p, km_txp_error(x->txp));
		at = km_txp_poll(x->txp, now);
		if (at < *next)
			*next = at;
	}
}
