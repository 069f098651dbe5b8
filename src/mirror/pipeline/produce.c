/* Produce to the destination: requests built from re-stamped headers and referenced record bytes, their answers. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/produce_response.h"
#include "kmirror/rpc.h"
#include "mirror/pipeline/pipeline.h"

typedef struct produce_ctx {
	int32_t node;
	unsigned lane;
	mpart **parts;
	mbatch **batches;
	size_t n;
} produce_ctx;

/*
 * Nothing planned is left, and the plan took holes after the last batch that landed (markers that
 * stand for nothing mirrored, batches the cleaner emptied): the tail moves past them, and its epoch
 * is theirs. The divergence check asks the source where that epoch ends, and the source has it up
 * to the tail; with the last landed batch's epoch, a source leader change after such a hole read
 * the source's next epoch starting at the hole as the mirrored records' loss (docs/reliability.md,
 * finding 23).
 */
void km_pl_past_holes(mpart *p)
{
	p->out.acked_logical = p->plan.fetch_logical;
	if (p->plan.fetch_epoch >= 0)
		p->out.acked_epoch = p->plan.fetch_epoch;
}

/*
 * b, taken off the head, is in the destination's log where it was planned (a batch acknowledged,
 * a marker landed): the tail moves after it, with the holes right after it once they are planned
 * (markers, compaction).
 */
void km_pl_landed(km_pipeline *pl, mpart *p, mbatch *b)
{
	p->out.acked_phys = b->physical + b->count;
	if (b->kind != BK_SEAL) { /* a seal is hidden: the logical tail stays where its run resumes */
		p->out.acked_logical = b->logical + b->count;
		p->out.acked_epoch = b->epoch;
	}
	if (!p->plan.head && p->plan.fetch_logical > p->out.acked_logical)
		km_pl_past_holes(p);
	p->out.failing_since = 0;
	km_pl_set_tail(pl, p, true);
	km_plan_batch_free(b);
	if (!p->plan.head && p->phase == PH_WRITING && p->fetch.ahead)
		km_pl_set_phase(p, PH_FETCHING, "its batches are all in, its next Fetch is out");
	else if (!p->plan.head && p->phase == PH_WRITING) {
		km_pl_set_phase(p, PH_READY, "its batches are all in");
		km_pl_run_past_holes(pl, p, PH_READY);
	}
}

bool km_pl_seal_due(km_pipeline *pl, mpart *p)
{
	const km_offrun *fence;
	const km_offmap *m;

	if (!p->out.probe || pl->writer_plain || p->out.acked_phys < 0 || p->out.acked_logical < 0 ||
	    p->plan.cont_logical < 0)
		return false; /* no run open at the tail: nothing of this life is mapped there */
	m = km_pl_map_of(pl, p, &fence);
	return m && m->n > 0; /* nothing mirrored: no earlier writer wrote here (its runs go first) */
}

/*
 * The seal: one record with a key no source record has and a value that says where the stop is, written
 * by the writer at the tail (L at E) with its run (L, E + 1) persisted first, so that no reader
 * through any kmirrord ever sees it. Once it is in, the broker refuses every write of an earlier
 * epoch of the writer on the partition. Should an earlier writer's batch reach the log first, the
 * seal lands past E: the probe logic hides everything from L on (produce_done), and the partition
 * settles at L all the same. Until it is known to have landed (seal_out), the partition does not
 * settle without a reconcile: a seal whose answer was lost may be in the log.
 */
bool km_pl_seal(km_pipeline *pl, mpart *p)
{
	char key[64], value[64];
	km_batch_params bp;
	km_batch_record rec;
	km_state_run r;
	km_wr w;
	mbatch *b;
	int64_t L = p->out.acked_logical, E = p->out.acked_phys;
	/*
	 * The run before ends where it reaches E: before holes passed after it, if any
	 * (km_pl_run_past_holes), never past L. Batches planned past L and dropped by the stop left
	 * cont_logical there; a run naming that end is refused, and the partition was then left to a
	 * reconcile that resumed past the seals of earlier stops (docs/reliability.md, finding 34).
	 */
	int64_t prev_end = p->plan.cont_logical < L ? p->plan.cont_logical : L;

	/* Short: it must pass the smallest max.message.bytes a topic may have. */
	snprintf(key, sizeof(key), "kmirror.seal/%lld.%d", (long long)p->plan.pid, p->plan.epoch);
	snprintf(value, sizeof(value), "stopped at %lld", (long long)L);
	km_batch_params_init(&bp);
	bp.producer_id = p->plan.pid;
	bp.producer_epoch = p->plan.epoch;
	bp.base_sequence = p->plan.seq;
	rec = (km_batch_record){.timestamp = km_wall_ms(),
				.key = {(const uint8_t *)key, (int32_t)strlen(key)},
				.value = {(const uint8_t *)value, (int32_t)strlen(value)}};
	km_wr_init(&w);
	if (km_batch_build(&bp, &rec, 1, &w) != KM_OK || !(b = calloc(1, sizeof(*b)))) {
		km_wr_free(&w);
		return false;
	}
	b->own = w.buf; /* the writer's buffer is the batch's own */
	b->own_len = b->size = w.len;
	memcpy(b->hdr, b->own, KM_BATCH_HEADER_SIZE);
	b->kind = BK_SEAL;
	b->logical = L;
	b->count = 1;
	b->physical = E;
	p->plan.seq = km_batch_seq_add(p->plan.seq, 1);
	p->plan.phys = E + 1;
	p->plan.cont_logical = L;
	p->plan.cont_lat = false;
	p->plan.head = p->plan.tail = b;
	p->recon.seal_out = true;
	r = (km_state_run){p->t->name, p->id, L, E + 1, prev_end, 0};
	km_pl_run_then(pl, p, &r, 1, PH_WRITING);
	return true;
}

/* ---- progress: the tails persisted for the instances that do not run the mirror ---- */

typedef struct progress_ctx {
	km_pipeline *pl;
	uint32_t life;
	size_t n;
	mpart **parts;
	int64_t *sent;
	int32_t *epochs;
	int64_t *open;
} progress_ctx;

static void on_progress(void *arg, const km_state_result *res)
{
	progress_ctx *x = arg;
	km_pipeline *pl = x->pl;

	pl->store_pending--;
	if (km_pl_current(pl, x->life)) {
		pl->progress_inflight = false;
		if (res->code == KM_OK)
			for (size_t i = 0; i < x->n; i++) {
				x->parts[i]->out.progress = x->sent[i];
				x->parts[i]->out.progress_epoch = x->epochs[i];
				x->parts[i]->out.progress_open = x->open[i];
			}
		else
			KM_DEBUG(COMP, 0, "%s: progress not persisted (asked again): %s", pl->name,
				 res->message ? res->message : km_err_name(res->code));
	}
	free(x->parts);
	free(x->sent);
	free(x->epochs);
	free(x->open);
	free(x);
}

/*
 * The partition's progress is to be written: its tail moved since the last write, or the record
 * persisted is no longer the one this pipeline wrote. Another writer's record there (a former
 * owner's write that landed late: a request held in a cut link, or retried) would otherwise stand
 * until the tail moves, and every instance that does not run the mirror would show it
 * (docs/state.md, "Writes of a former owner"). t: the partition's topic in the store.
 */
static bool progress_moved(km_pipeline *pl, const mpart *p, const km_state_topic *t)
{
	const km_offrun *fence;
	const km_offmap *m;
	km_mp_state state;
	int64_t persisted;
	int32_t epoch;

	if (!p || !p->out.tail || p->out.acked_logical < 0)
		return false;
	/* Not past holes until their run is in (km_pl_run_past_holes): it says where the tail is. */
	m = km_pl_map_of(pl, p, &fence);
	if (m && p->out.acked_phys >= 0 && !km_offmap_maps_tail(m, p->out.acked_phys, p->out.acked_logical))
		return false;
	if (p->out.acked_logical != p->out.progress || p->out.acked_epoch != p->out.progress_epoch ||
	    km_pl_open_txn_logical(p) != p->out.progress_open)
		return true;
	/* Only where a progress is written (not while stopping: the stop's own record says where it stood). */
	return p->out.progress >= 0 &&
	       (p->state == KM_MP_PREPARING || p->state == KM_MP_MIRRORING || p->state == KM_MP_PAUSING) &&
	       km_state_partition_record(t, p->id, &state, &persisted, &epoch) &&
	       (persisted != p->out.progress || epoch != p->out.progress_epoch);
}

void km_pl_progress(km_pipeline *pl, int64_t now, int64_t *next)
{
	km_state *st = km_mirror_store(pl->mi);
	km_state_progress *items;
	progress_ctx *x;
	size_t n = 0;

	if (pl->progress_inflight)
		return;
	if (now - pl->progress_at < KM_MIRROR_PROGRESS_MS) {
		if (pl->progress_at + KM_MIRROR_PROGRESS_MS < *next)
			*next = pl->progress_at + KM_MIRROR_PROGRESS_MS;
		return;
	}
	pl->progress_at = now;
	for (size_t i = 0; i < pl->ntopics; i++) {
		const km_state_topic *t = km_state_topic_find(st, pl->topics[i]->name, strlen(pl->topics[i]->name));
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++)
			if (progress_moved(pl, pl->topics[i]->parts[j], t)) {
				pl->topics[i]->parts[j]->out.progress_due = true;
				n++;
			}
	}
	if (!n)
		return;
	items = calloc(n, sizeof(*items));
	x = calloc(1, sizeof(*x));
	if (!items || !x || !(x->parts = calloc(n, sizeof(*x->parts))) || !(x->sent = calloc(n, sizeof(*x->sent))) ||
	    !(x->epochs = calloc(n, sizeof(*x->epochs))) || !(x->open = calloc(n, sizeof(*x->open)))) {
		free(items);
		if (x) {
			free(x->parts);
			free(x->sent);
			free(x->epochs);
			free(x);
		}
		return; /* out of memory: the next round tries again */
	}
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			mpart *p = pl->topics[i]->parts[j];
			if (!p || !p->out.progress_due)
				continue;
			p->out.progress_due = false;
			x->open[x->n] = km_pl_open_txn_logical(p);
			items[x->n] = (km_state_progress){p->t->name, p->id, p->out.acked_logical, p->out.acked_epoch,
							  x->open[x->n]};
			x->parts[x->n] = p;
			x->epochs[x->n] = p->out.acked_epoch;
			x->sent[x->n++] = p->out.acked_logical;
		}
	x->pl = pl;
	x->life = pl->life;
	pl->progress_inflight = true;
	pl->store_pending++;
	km_state_progress_write(km_mirror_store(pl->mi), pl->name, items, x->n, on_progress, x);
	free(items); /* the store took its copy */
}

static void produce_done(km_pipeline *pl, mpart *p, mbatch *b, int16_t code, int64_t base, const char *msg)
{
	char tag[300], why[400];

	p->out.inflight--;
	if (km_pl_reconciling(p) || p->phase == PH_IDLE) {
		/* Reconcile decides from the log what landed. */
		if (p->plan.head == b)
			p->plan.head = b->next;
		if (p->plan.tail == b)
			p->plan.tail = p->plan.head ? p->plan.tail : NULL;
		km_plan_batch_free(b);
		return;
	}
	if (code == 46) /* DUPLICATE_SEQUENCE_NUMBER: it landed before */
		code = 0;
	if (code == 0 && base != b->physical && base >= 0) {
		/*
		 * It landed elsewhere than planned: something else reached the log first (a write of a
		 * previous run still in flight when it died). Hide what is there from the planned point on.
		 */
		KM_WARN(COMP, 0, "%s/%s: a batch for offset %lld landed at destination offset %lld, not %lld",
			pl->name, km_pl_ptag(p, tag, sizeof(tag)), (long long)b->logical, (long long)base,
			(long long)b->physical);
		/* Reconcile hides what is there from this batch's logical start on (after_reconcile). */
		if (p->recon.hide_logical < 0 || b->logical < p->recon.hide_logical)
			p->recon.hide_logical = b->logical;
		km_pl_reconcile(pl, p, "a batch landed at an unexpected offset");
		if (p->plan.head == b)
			p->plan.head = b->next;
		if (!p->plan.head)
			p->plan.tail = NULL;
		km_plan_batch_free(b);
		return;
	}
	if (p->plan.head == b)
		p->plan.head = b->next;
	if (!p->plan.head)
		p->plan.tail = NULL;
	if (code == 0) {
		if (b->kind != BK_SEAL) {
			p->stats.records += (uint64_t)b->count;
			p->stats.bytes += b->size;
			p->stats.batches++;
			if (b->max_ts > p->out.newest_ts)
				p->out.newest_ts = b->max_ts;
		}
		p->out.probe = false;
		p->recon.seal_out = false;
		p->retry.backoff_ms = 0;
		km_pl_landed(pl, p, b);
		return;
	}
	snprintf(why, sizeof(why), "destination Produce failed: %s%s%s", km_err_name((km_err)code), msg ? ": " : "",
		 msg ? msg : "");
	/*
	 * A transaction's batch refused for its transaction's sake (INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING,
	 * PRODUCER_FENCED, TRANSACTION_ABORTABLE, the destination's own timeout aborted it): reconcile fences
	 * and carries the source transaction again.
	 */
	bool txn_retry = b->kind == BK_TXN && (code == 48 || code == 49 || code == 90 || code == 120 || code == 51);
	if (code == 47 && b->kind != BK_TXN) {
		/*
		 * INVALID_PRODUCER_EPOCH: a newer epoch of the mirror's writer wrote the partition, so another
		 * kmirrord runs the mirror (or this one's lease is about to say it lost it). Reconcile would
		 * take the next epoch and fence that one in turn: it waits long enough for the lease to
		 * retire this pipeline first if the mirror is no longer its own.
		 */
		pl->fenced++;
		KM_WARN(COMP, 0, "%s/%s: fenced: a newer epoch of the mirror's writer wrote the partition (another "
			"kmirrord runs the mirror); this one writes nothing more there unless the mirror is still its own "
			"in %d s", pl->name, km_pl_ptag(p, tag, sizeof(tag)), FENCED_WAIT_MS / 1000);
		km_plan_batch_free(b);
		km_pl_reconcile(pl, p, why);
		p->retry.at = km_wall_ms() + FENCED_WAIT_MS;
		km_mirror_rebalance_soon(pl->mi);
		return;
	}
	km_plan_batch_free(b);
	if (km_err_retriable((km_err)code) || code == 45 || code == 47 || txn_retry) {
		if (code == 6 || code == 3 || code == 5)
			pl->dst_meta_need = true;
		km_pl_reconcile(pl, p, why);
	} else {
		km_pl_fail_part(pl, p, why);
	}
}

static void on_produce(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	produce_ctx *pc = x->extra;
	int16_t ver = x->ver;
	km_produce_response r;
	km_arena a;
	km_rd rd;
	bool decoded = false;
	mnode_io *io;

	free(x);
	if (pl->closing) {
		free(pc->parts);
		free(pc->batches);
		free(pc);
		return;
	}
	if ((io = km_pl_node_io(&pl->dio, &pl->ndio, pc->node, pc->lane)))
		io->produce_inflight--;
	km_arena_init(&a, 0);
	if (err == KM_OK) {
		km_rd_init(&rd, body, len);
		decoded = km_produce_response_decode(&rd, ver, &r, &a) == KM_OK;
	} else {
		km_cluster_drop(pl->dst, c);
		pl->dst_meta_need = true;
	}
	for (size_t i = 0; i < pc->n; i++) {
		mpart *p = pc->parts[i];
		int16_t code = -1;
		int64_t base = -1;
		const char *msg = err != KM_OK ? km_err_name(err) : "undecodable response";
		char mbuf[256];
		for (int32_t ti = 0; decoded && ti < r.responses.count; ti++) {
			const km_produce_response_topic_produce_response *tr = &r.responses.items[ti];
			if (!km_str_eq_c(tr->name, p->t->name))
				continue;
			for (int32_t k = 0; k < tr->partition_responses.count; k++)
				if (tr->partition_responses.items[k].index == p->id) {
					const km_produce_response_partition_produce_response *pr =
						&tr->partition_responses.items[k];
					code = pr->error_code;
					base = pr->base_offset;
					msg = NULL;
					if (pr->error_message.len > 0) {
						snprintf(mbuf, sizeof(mbuf), "%.*s", (int)pr->error_message.len,
							 pr->error_message.p);
						msg = mbuf;
					}
				}
		}
		if (code < 0)
			code = 13; /* NETWORK_EXCEPTION: the outcome is unknown, reconcile decides */
		produce_done(pl, p, pc->batches[i], code, base, msg);
	}
	km_arena_free(&a);
	free(pc->parts);
	free(pc->batches);
	free(pc);
	km_pl_tick_soon(pl);
}

static void encode_str(km_wr *w, bool flex, const char *s)
{
	km_wr_string(w, flex, km_str_c(s));
}

/* p's next unsent batch when p writes to node's lane, else NULL. */
static mbatch *next_on(mpart *p, int32_t node, unsigned lane)
{
	return p && p->lead.dst == node && p->out.lane == lane ? km_pl_next_unsent(p) : NULL;
}

/* Pieces a request to node's lane may need: two framing pieces and the record pieces of each partition's next batch. */
static size_t piece_cap(km_pipeline *pl, int32_t node, unsigned lane, size_t cap)
{
	size_t n = cap * 3;
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			mpart *p = pl->topics[i]->parts[j];
			mbatch *b = next_on(p, node, lane);
			if (b)
				n += (size_t)b->nvec;
		}
	return n;
}

/* One framing piece: encoded here, copied by the client when the request is taken. */
static km_wr *frame_piece(km_wr *enc, size_t *nenc, km_net_piece *pieces, size_t *npieces)
{
	km_wr *w = &enc[(*nenc)++];
	km_wr_init(w);
	pieces[(*npieces)++] = (km_net_piece){0}; /* pointed at w once every piece is encoded */
	return w;
}

/* A Produce request being built: the batches chosen, grouped by topic, and the pieces that carry them. */
typedef struct produce_req {
	produce_ctx *pc;          /* the partitions and batches chosen (pc->n of them once sent) */
	size_t n, bytes;
	size_t *gstart, ngroups;  /* where each topic's group starts in pc */
	km_net_piece *pieces;     /* framing pieces (enc) and record pieces, in wire order */
	size_t npieces;
	km_wr *enc;
	size_t nenc;
	km_txp *txp;              /* a transaction's batch: its producer (one per request) */
	int16_t ver;
	bool flex;
} produce_req;

/*
 * Choose: one batch per partition led by node on the lane, grouped by topic, within the byte cap. A
 * transaction's batch goes alone (its producer is the partition's own: one transactional producer
 * per request, a broker rule); the first partition ready decides which kind this request is.
 */
static void produce_choose(km_pipeline *pl, int32_t node, unsigned lane, produce_req *r)
{
	produce_ctx *pc = r->pc;
	for (size_t i = 0; i < pl->ntopics && r->bytes < PRODUCE_REQUEST_BYTES && !r->txp; i++) {
		mtopic *t = pl->topics[i];
		size_t first = r->n;
		for (int32_t j = 0; j < t->nparts; j++) {
			mpart *p = t->parts[j];
			mbatch *b = next_on(p, node, lane);
			if (!b || (r->n && b->kind == BK_TXN))
				continue;
			if (r->n && r->bytes + b->size > PRODUCE_REQUEST_BYTES)
				break;
			if (b->kind == BK_TXN) {
				km_txp *txp = p->txn.tx[b->txi].txp;
				if (km_plan_stamp_txn(b, km_txp_pid(txp), km_txp_epoch(txp), km_txp_seq(txp)) != KM_OK)
					continue;
				r->txp = txp;
				if (r->ver > PRODUCE_TXN_HI)
					r->ver = PRODUCE_TXN_HI;
				r->flex = r->ver >= 9;
			}
			pc->parts[r->n] = p;
			pc->batches[r->n] = b;
			r->bytes += b->size;
			r->n++;
			if (r->txp)
				break;
		}
		if (r->n > first)
			r->gstart[r->ngroups++] = first;
	}
	r->gstart[r->ngroups] = r->n;
}

/* One partition's entry: its index and the batch, the header re-stamped, the record bytes referenced. */
static km_wr *produce_encode_part(produce_req *r, size_t k, km_wr *w)
{
	mbatch *b = r->pc->batches[k];
	km_wr_i32(w, r->pc->parts[k]->id);
	if (r->flex)
		km_wr_uvarint(w, (uint32_t)b->size + 1);
	else
		km_wr_i32(w, (int32_t)b->size);
	km_wr_raw(w, b->hdr, KM_BATCH_HEADER_SIZE);
	if (b->size > KM_BATCH_HEADER_SIZE) {
		if (b->own) {
			r->pieces[r->npieces++] = (km_net_piece){.p = b->own + KM_BATCH_HEADER_SIZE,
								 .len = b->size - KM_BATCH_HEADER_SIZE};
		} else {
			/* The record bytes where they are in the fetched response's chains. */
			for (int v = 0; v < b->nvec; v++) {
				b->resp->refs++;
				r->pieces[r->npieces++] = (km_net_piece){.p = b->vec[v].iov_base, .len = b->vec[v].iov_len,
									 .release = km_plan_resp_unref,
									 .release_arg = b->resp};
			}
		}
	}
	w = frame_piece(r->enc, &r->nenc, r->pieces, &r->npieces);
	if (r->flex)
		km_wr_uvarint(w, 0); /* the partition's tags */
	return w;
}

/* Encode: transactional id (null for the idempotent producer), acks=all, timeout, the topics. */
static bool produce_encode(produce_req *r)
{
	km_wr *w = frame_piece(r->enc, &r->nenc, r->pieces, &r->npieces);
	size_t e = 0;

	if (r->txp)
		encode_str(w, r->flex, km_txp_id(r->txp));
	else if (r->flex)
		km_wr_uvarint(w, 0);
	else
		km_wr_i16(w, -1);
	km_wr_i16(w, -1);
	km_wr_i32(w, 30000);
	km_wr_array_len(w, r->flex, (int32_t)r->ngroups);
	for (size_t g = 0; g < r->ngroups; g++) {
		w = frame_piece(r->enc, &r->nenc, r->pieces, &r->npieces);
		encode_str(w, r->flex, r->pc->parts[r->gstart[g]]->t->name);
		km_wr_array_len(w, r->flex, (int32_t)(r->gstart[g + 1] - r->gstart[g]));
		for (size_t k = r->gstart[g]; k < r->gstart[g + 1]; k++) {
			if (k > r->gstart[g])
				w = frame_piece(r->enc, &r->nenc, r->pieces, &r->npieces);
			w = produce_encode_part(r, k, w);
		}
		if (r->flex)
			km_wr_uvarint(w, 0); /* the topic's tags */
	}
	if (r->flex)
		km_wr_uvarint(&r->enc[r->nenc - 1], 0); /* the request's tags */
	/* Point the framing pieces at their encoded bytes, in order. */
	for (size_t i = 0; i < r->npieces; i++) {
		if (r->pieces[i].p || r->pieces[i].buf)
			continue;
		if (e >= r->nenc || !km_wr_ok(&r->enc[e]))
			return false;
		r->pieces[i].p = r->enc[e].buf;
		r->pieces[i].len = r->enc[e].len;
		e++;
	}
	return true;
}

static void produce_req_free(produce_req *r, bool sent)
{
	if (!sent)
		/* The referenced pieces were not taken: give their references back. */
		for (size_t i = 0; r->pieces && i < r->npieces; i++)
			if (r->pieces[i].release)
				r->pieces[i].release(r->pieces[i].release_arg);
	for (size_t i = 0; r->enc && i < r->nenc; i++)
		km_wr_free(&r->enc[i]);
	free(r->enc);
	free(r->pieces);
	free(r->gstart);
	if (r->pc && !sent) {
		free(r->pc->parts);
		free(r->pc->batches);
		free(r->pc);
	}
}

/*
 * One Produce request to node on lane: one batch per partition (a broker rule), as many partitions
 * led by node and writing on the lane as have one ready, up to PRODUCE_REQUEST_BYTES. The batch headers are the re-stamped
 * copies; the record bytes are referenced in the fetched response, never copied here.
 */
bool km_pl_send_produce(km_pipeline *pl, int32_t node, unsigned lane)
{
	km_net_client *c = km_cluster_lane(pl->dst, node, lane);
	mnode_io *io = km_pl_node_io(&pl->dio, &pl->ndio, node, lane);
	produce_req r = {0};
	size_t cap = 0;
	km_net_request rq;
	req_ctx *x = NULL;
	bool ok = false;

	if (!io || io->produce_inflight >= KM_MIRROR_PRODUCE_INFLIGHT)
		return false;
	if (!c) {
		pl->dst_meta_need = true;
		return false;
	}
	if (!km_cluster_usable(pl->dst, c))
		return false;
	if ((r.ver = km_net_version_pick(c, KM_API_PRODUCE, PRODUCE_LO, PRODUCE_HI)) < 0)
		return false;
	r.flex = r.ver >= 9;
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			if (next_on(pl->topics[i]->parts[j], node, lane))
				cap++;
		}
	if (!cap)
		return false;
	r.pc = calloc(1, sizeof(*r.pc));
	if (!r.pc || !(r.pc->parts = calloc(cap, sizeof(*r.pc->parts))) ||
	    !(r.pc->batches = calloc(cap, sizeof(*r.pc->batches))) || !(r.gstart = calloc(cap + 1, sizeof(*r.gstart))) ||
	    !(r.pieces = calloc(piece_cap(pl, node, lane, cap) + pl->ntopics * 2 + 2, sizeof(*r.pieces))) ||
	    !(r.enc = calloc(cap * 2 + pl->ntopics * 2 + 2, sizeof(*r.enc))))
		goto out;
	r.pc->node = node;
	r.pc->lane = lane;
	produce_choose(pl, node, lane, &r);
	if (!produce_encode(&r) || !(x = km_pl_ctx_new(pl, pl->dst, node, r.ver)))
		goto out;
	x->extra = r.pc;
	r.pc->n = r.n;
	km_net_request_init(&rq, KM_API_PRODUCE, r.ver);
	rq.pieces = r.pieces;
	rq.npieces = r.npieces;
	rq.delivery = KM_NET_FLAT;
	rq.on_flat = on_produce;
	rq.arg = x;
	if (km_net_client_request(c, &rq) != KM_OK) {
		free(x);
		km_cluster_drop(pl->dst, c);
		goto out;
	}
	for (size_t i = 0; i < r.n; i++) {
		r.pc->batches[i]->sent = true;
		r.pc->parts[i]->out.inflight++;
	}
	if (r.txp)
		km_txp_advance(r.txp, r.pc->batches[0]->count);
	io->produce_inflight++;
	pl->produces[lane]++;
	ok = true;
out:
	produce_req_free(&r, ok);
	return ok;
}
