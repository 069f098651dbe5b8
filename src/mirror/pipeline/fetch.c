/* Fetch from the source: fetch sessions, the answer taken as it streams in, runs persisted before their batches go. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/fetch.h"
#include "kmirror/hash.h"
#include "kmirror/log.h"
#include "kmirror/msg/fetch_request.h"
#include "kmirror/rpc.h"
#include "mirror/pipeline/pipeline.h"

static void session_reset(km_pipeline *pl, int32_t node, unsigned lane);

/* One Fetch and its answer as it streams in (on_fetch_stream). */
typedef struct fetch_ctx fetch_ctx;

struct fetch_ctx {
	km_pipeline *pl;
	int32_t node;
	unsigned lane; /* the fetch lane it went on (a group's session lane, or a side lane: fetch.c, group_lane) */
	mpart **parts; /* the partitions it was sent for (ready then) */
	size_t n, cap; /* cap: the ready ones counted before the sends (one may make more ready: they wait) */
	uint64_t seq; /* stamped on its partitions: an answer for a partition it did not ask for is ignored */
	bool full, sessions; /* a full request (opening a session when sessions is set) */
	/* the answer */
	mresp *resp;         /* NULL until its first bytes */
	size_t pre;          /* the size prefix and header put in front of the body */
	km_fetch_walk w;
	bool session_done, dropped, bad, ended;
	mpart *cur;          /* the partition whose batches are being taken */
	size_t cur_runs;     /* ra.n when it started: more means it starts runs */
	bool pend;           /* the walk stopped at a batch whose bytes are not all here yet */
	size_t pend_off, pend_size;
	struct evbuffer_ptr cursor;
	size_t cur_off;
	bool cur_valid;
	int64_t sent_at;
	runs_acc ra;         /* the runs the answer's batches start */
	mpart **later;       /* partitions that wait for them to be persisted */
	size_t nlater;
};

typedef struct runs_ctx {
	km_pipeline *pl;
	uint32_t life;
	mpart **parts;
	size_t n;
} runs_ctx;

static void on_runs(void *arg, const km_state_result *res)
{
	runs_ctx *rc = arg;
	km_pipeline *pl = rc->pl;

	pl->store_pending--;
	for (size_t i = 0; i < rc->n && km_pl_current(pl, rc->life); i++) {
		mpart *p = rc->parts[i];
		if (p->phase != PH_RUNS)
			continue;
		if (res->code != KM_OK)
			km_pl_reconcile(pl, p, "the offset map could not be persisted");
		else
			km_pl_set_phase(p, p->plan.head ? PH_WRITING : PH_READY, "its runs are persisted");
	}
	free(rc->parts);
	free(rc);
	if (!pl->closing)
		km_pl_tick_soon(pl);
}

/* p is in the Fetch seq: FETCHING, or WRITING with the Fetch sent ahead (km_pl_fetch_ahead). */
static bool in_fetch(const mpart *p, uint64_t seq)
{
	return p->fetch.seq == seq && (p->phase == PH_FETCHING || (p->phase == PH_WRITING && p->fetch.ahead));
}

static void handle_fetch_error(km_pipeline *pl, mpart *p, int16_t code)
{
	char tag[300];
	p->stats.errors++;
	if (p->fetch.ahead) {
		/* Sent ahead: fetched again once its batches are in, where the error, if it holds, is handled. */
		p->fetch.ahead = false;
		if (km_pl_source_meta_stale(code))
			pl->src_meta_need = true;
		if (code != 1)
			km_pl_backoff(p);
		return;
	}
	if (code == 1) { /* OFFSET_OUT_OF_RANGE: behind the source's log start (retention, DeleteRecords), or past its end */
		p->start.oor = true;
		/* ListOffsets(earliest); after_start counts the hole */
		km_pl_set_phase(p, PH_START, "the source answered OFFSET_OUT_OF_RANGE");
		p->retry.at = 0;
	} else if (km_pl_source_meta_stale(code)) {
		pl->src_meta_need = true;
		km_pl_set_phase(p, PH_READY, "a source Fetch error: the metadata is asked again");
		km_pl_backoff(p);
	} else {
		KM_WARN(COMP, 0, "%s/%s: source Fetch error %s", pl->name, km_pl_ptag(p, tag, sizeof(tag)),
			km_err_name((km_err)code));
		km_pl_set_phase(p, PH_READY, "a source Fetch error");
		km_pl_backoff(p);
	}
}

/*
 * The session part of a Fetch answer (v7+: ThrottleTimeMs, ErrorCode, SessionId first, in h): a
 * full request's answer opens the session (id 0: the broker keeps none, the next request is full
 * again), an incremental one moves the epoch on. An error (FETCH_SESSION_ID_NOT_FOUND after an
 * eviction or a broker restart, INVALID_FETCH_SESSION_EPOCH) drops the session: false, nothing to
 * take.
 */
static bool take_session(km_pipeline *pl, const fetch_ctx *fc, const uint8_t h[10])
{
	mnode_io *io = km_pl_node_io(&pl->sio, &pl->nsio, fc->node, fc->lane);
	int16_t code = (int16_t)km_be16(h + 4);
	int32_t id = (int32_t)km_be32(h + 6);

	if (!io)
		return false;
	if (code) {
		KM_INFO(COMP, 0, "%s: source broker %d answered the fetch session %d with %s: a new session follows",
			pl->name, (int)fc->node, (int)io->sess_id, km_err_name((km_err)code));
		session_reset(pl, fc->node, fc->lane);
		return false;
	}
	if (fc->full) {
		io->sess_id = id;
		io->sess_epoch = 1;
		if (id)
			KM_DEBUG(COMP, 0, "%s: fetch session %d with source broker %d (lane %u)", pl->name, (int)id,
				 (int)fc->node, fc->lane);
	} else {
		io->sess_epoch = io->sess_epoch == INT32_MAX ? 1 : io->sess_epoch + 1;
	}
	return true;
}

/*
 * A partition's part of the answer is all here: its batches go to the destination now, unless
 * they start runs, which wait for the answer's end (one store write for all of them).
 */
static void finish_part(fetch_ctx *fc, mpart *p, size_t runs_before)
{
	km_pipeline *pl = fc->pl;

	if (!p || !in_fetch(p, fc->seq))
		return; /* failed or moved meanwhile */
	if (fc->ra.n > runs_before) {
		km_pl_set_phase(p, PH_RUNS, "its batches start runs");
		fc->later[fc->nlater++] = p;
		return;
	}
	if (p->fetch.ahead)
		p->fetch.ahead = false; /* WRITING still: what it took goes after what is in flight */
	else
		km_pl_set_phase(p, p->plan.head ? PH_WRITING : PH_READY, "its part of the answer is in");
	if (!p->plan.head && !p->out.inflight && p->plan.fetch_logical > p->out.acked_logical) {
		/* Only holes came (markers, emptied batches): the tail moves past them, in their epoch. */
		km_pl_past_holes(p);
		km_pl_set_tail(pl, p, true);
	}
	if (p->phase == PH_READY)
		km_pl_run_past_holes(pl, p, PH_READY);
	if (p->plan.head)
		km_pl_tick_soon(pl); /* written while the rest of the answer arrives */
}

/* The batch the walk stopped at, now that its bytes are all here. */
static void take_pending(fetch_ctx *fc)
{
	km_pipeline *pl = fc->pl;
	struct evbuffer *buf = fc->resp->buf;
	uint8_t h[KM_BATCH_HEADER_SIZE];
	struct evbuffer_ptr ptr;
	const char *fail = NULL;
	mplan_env env;
	km_err rc;

	fc->pend = false;
	if (fc->cur && !in_fetch(fc->cur, fc->seq))
		fc->cur = NULL; /* reconciled or failed between two parts of the answer: the rest is not taken */
	if (!fc->cur)
		return;
	/* A cursor moved forward batch by batch: each costs only the chains it crosses. */
	if (fc->cur_valid && fc->pend_off >= fc->cur_off)
		rc = evbuffer_ptr_set(buf, &fc->cursor, fc->pend_off - fc->cur_off, EVBUFFER_PTR_ADD) ? KM_ERR_DECODE : KM_OK;
	else
		rc = evbuffer_ptr_set(buf, &fc->cursor, fc->pend_off, EVBUFFER_PTR_SET) ? KM_ERR_DECODE : KM_OK;
	fc->cur_valid = rc == KM_OK;
	fc->cur_off = fc->pend_off;
	ptr = fc->cursor;
	if (rc != KM_OK || evbuffer_copyout_from(buf, &ptr, h, sizeof(h)) != (ev_ssize_t)sizeof(h)) {
		fc->bad = true;
		return;
	}
	env = (mplan_env){km_pl_txn_slot, fc->cur, pl->txl == TXL_UNSUPPORTED};
	rc = km_plan_take(&fc->cur->plan, &env, fc->resp, &fc->cursor, fc->pend_size, h, &fc->ra, &fail);
	if (rc == KM_ERR_INVAL && !fc->cur->fetch.overlap_seen) {
		/*
		 * The source's log is not the one mirrored: a source topic deleted and created again says
		 * so by its topic id, which the next Metadata checks (meta.c) before the partition fails
		 * here, once more, for what this is otherwise.
		 */
		fc->cur->fetch.overlap_seen = true;
		fc->cur->fetch.overlap_at = pl->src_meta_answers;
		pl->src_meta_need = true;
		pl->src_meta_to_node = true; /* the broker that served the batch knows the topic it is from */
		pl->src_meta_node = fc->cur->lead.src;
		km_pl_backoff(fc->cur);
		fc->cur = NULL;
	} else if (rc != KM_OK) {
		km_pl_fail_part(pl, fc->cur, fail ? fail : km_err_name(rc));
		fc->cur = NULL;
	}
}

/* Walk what has arrived of the answer, as far as it goes. */
static void walk_answer(fetch_ctx *fc)
{
	km_pipeline *pl = fc->pl;
	struct evbuffer *buf = fc->resp->buf;

	while (!fc->bad && !fc->ended) {
		km_fw_event ev;
		if (fc->pend) {
			if (fc->pend_off + fc->pend_size > evbuffer_get_length(buf))
				return; /* its bytes are still coming */
			take_pending(fc);
			continue;
		}
		ev = km_fetch_walk_next(&fc->w, buf, 0);
		if (ev == KM_FW_NEED_MORE)
			return;
		if (ev == KM_FW_ERROR) {
			fc->bad = true;
			return;
		}
		if (ev == KM_FW_END) {
			finish_part(fc, fc->cur, fc->cur_runs);
			fc->cur = NULL;
			fc->ended = true;
			return;
		}
		if (ev == KM_FW_PARTITION) {
			const km_fetch_part *fp = &fc->w.part;
			mtopic *t = km_pl_topic_get(pl, fp->topic, false);
			mpart *p = t ? km_pl_part_get(pl, t, fp->partition, false) : NULL;
			finish_part(fc, fc->cur, fc->cur_runs);
			fc->cur = NULL;
			if (!p || !in_fetch(p, fc->seq) || p->fetch.taken)
				continue; /* not asked for here, listed twice, or failed meanwhile: dropped */
			/*
			 * It stays FETCHING while its batches arrive: nothing else moves it meanwhile (fetched
			 * ahead, it stays WRITING, and what it plans waits: km_pl_taking_ahead).
			 */
			p->fetch.taken = true;
			if (fp->error_code) {
				handle_fetch_error(pl, p, fp->error_code);
				continue;
			}
			km_state_partition_progress(km_mirror_store(pl->mi), p->t->name, p->id, fp->high_watermark, -1);
			p->stats.source_end = fp->high_watermark;
			if (fp->log_start_offset >= 0)
				p->ls.src = fp->log_start_offset;
			km_pl_update_lag(p, km_wall_ms());
			p->retry.backoff_ms = 0;
			fc->cur = p;
			fc->cur_runs = fc->ra.n;
			fc->w.descend = true;
			continue;
		}
		if (ev == KM_FW_BATCH && fc->cur) {
			size_t size = KM_BATCH_LOG_OVERHEAD + (size_t)(fc->w.batch.length > 0 ? fc->w.batch.length : 0);
			if (fc->w.batch.partial)
				continue; /* cut by the fetch size: the next fetch starts at it */
			if (size < KM_BATCH_HEADER_SIZE) {
				km_pl_fail_part(pl, fc->cur, "the source sent a record batch too short for its header");
				fc->cur = NULL;
				continue;
			}
			fc->pend = true;
			fc->pend_off = fc->w.batch.off;
			fc->pend_size = size;
		}
	}
}

static void fetch_ctx_free(fetch_ctx *fc)
{
	if (fc->resp)
		km_plan_resp_unref(fc->resp);
	free(fc->ra.runs);
	free(fc->later);
	free(fc->parts);
	free(fc);
}

/*
 * An answer that came at once and gave none of the partitions it was sent for anything: the broker
 * did not wait (max_wait) because of data for a partition the request holds at size 0 in the
 * session (one still writing its batches, as while the destination is down). Fetching again at
 * once would spin; the next Fetch to that broker waits unless more partitions are ready: 5 ms
 * after one such answer (a write a moment from its end, the usual case), doubling while they keep
 * coming, to 100 ms (writes that do not end). The records of the other partitions wait as long.
 */
static void quiet_after(fetch_ctx *fc, mnode_io *io, bool failed)
{
	int64_t now = km_wall_ms();
	bool taken = false;

	for (size_t i = 0; i < fc->n && !taken; i++)
		taken = fc->parts[i]->fetch.taken;
	if (!io || failed)
		return;
	if (taken || !fc->n || now - fc->sent_at >= FETCH_MAX_WAIT_MS / 2) {
		io->quiet_ms = 0;
		return;
	}
	io->quiet_ms = io->quiet_ms ? (io->quiet_ms * 2 > QUIET_MS ? QUIET_MS : io->quiet_ms * 2) : QUIET_MIN_MS;
	io->quiet_until = now + io->quiet_ms;
	io->quiet_ready = fc->n;
}

/* The answer is in (or failed): partitions with new runs persist them, the others it left are ready again. */
static void end_answer(fetch_ctx *fc, bool failed)
{
	km_pipeline *pl = fc->pl;
	mnode_io *io = km_pl_node_io(&pl->sio, &pl->nsio, fc->node, fc->lane);

	if (io)
		io->fetching = false;
	quiet_after(fc, io, failed);
	if (!failed && !fc->dropped && (fc->bad || !fc->ended))
		KM_WARN(COMP, 0, "%s: undecodable Fetch response from source broker %d", pl->name, (int)fc->node);
	/* The batches taken are whole and stay good when the rest of the answer is lost. */
	if (!fc->ended)
		finish_part(fc, fc->cur, fc->cur_runs);
	for (size_t i = 0; i < fc->n; i++) {
		mpart *p = fc->parts[i];
		p->fetch.taken = false;
		if (p->phase == PH_FETCHING && p->fetch.seq == fc->seq)
			km_pl_set_phase(p, PH_READY, "nothing for it in the answer");
		else if (p->fetch.ahead && p->fetch.seq == fc->seq)
			p->fetch.ahead = false; /* nothing for it in the answer: fetched again from where it asked */
	}
	if (fc->nlater) {
		runs_ctx *rc = calloc(1, sizeof(*rc));
		size_t keep = 0;
		/* Only the runs of partitions still waiting for them (one reconciled meanwhile starts over). */
		for (size_t i = 0; i < fc->ra.n; i++)
			for (size_t k = 0; k < fc->nlater; k++)
				if (fc->later[k]->phase == PH_RUNS && fc->later[k]->id == fc->ra.runs[i].partition &&
				    fc->later[k]->t->name == fc->ra.runs[i].topic) {
					fc->ra.runs[keep++] = fc->ra.runs[i];
					break;
				}
		fc->ra.n = keep;
		if (rc && !keep) {
			free(rc);
		} else if (rc) {
			rc->pl = pl;
			rc->life = pl->life;
			rc->parts = fc->later;
			rc->n = fc->nlater;
			fc->later = NULL;
			pl->store_pending++;
			km_state_runs_write(km_mirror_store(pl->mi), pl->name, fc->ra.runs, fc->ra.n, on_runs, rc);
		} else {
			for (size_t i = 0; i < fc->nlater; i++)
				km_pl_reconcile(pl, fc->later[i], "out of memory");
		}
	}
	fetch_ctx_free(fc);
	km_pl_tick_soon(pl);
}

/*
 * The Fetch answer as it arrives (KM_NET_STREAM): its bytes are moved, not copied, onto the end of
 * one evbuffer (the frame as the walker reads it, behind a size prefix and header of our own) and
 * released to the client at once (the pipeline bounds what it holds itself, held_cap). Each batch
 * is taken as soon as its bytes are all there; a partition's batches go to the destination as soon
 * as the partition's part of the answer is in, while the rest still arrives.
 */
static void on_fetch_stream(km_net_client *c, km_err err, struct evbuffer *chunk, size_t off, bool last, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	fetch_ctx *fc = x->extra;
	size_t n;

	(void)off;
	if (pl->closing) {
		if (chunk)
			km_net_client_release(c, evbuffer_get_length(chunk));
		if (last) {
			fetch_ctx_free(fc);
			free(x);
		}
		return;
	}
	if (err != KM_OK || !chunk) {
		KM_WARN(COMP, 0, "%s: Fetch from source broker %d failed: %s", pl->name, (int)fc->node, km_err_name(err));
		km_pl_source_contact(pl, err != KM_OK ? err : KM_ERR_IO, false);
		km_cluster_drop(pl->src, c);
		pl->src_meta_need = true;
		if (fc->sessions)
			session_reset(pl, fc->node, fc->lane);
		free(x);
		end_answer(fc, true);
		return;
	}
	n = evbuffer_get_length(chunk);
	if (!fc->resp) {
		/* The walker reads a frame: a size prefix, a correlation id and (v12+) header tags come first. */
		uint8_t pre[9] = {0};
		size_t total = km_net_client_stream_size(c);
		fc->pre = x->ver >= 12 ? 9 : 8;
		km_put_be32(pre, (uint32_t)(total + fc->pre - 4));
		if (!(fc->resp = calloc(1, sizeof(*fc->resp))) || !(fc->resp->buf = evbuffer_new()) ||
		    evbuffer_add(fc->resp->buf, pre, fc->pre) != 0) {
			if (fc->resp && fc->resp->buf)
				evbuffer_free(fc->resp->buf);
			free(fc->resp);
			fc->resp = NULL;
			km_net_client_release(c, n);
			fc->dropped = true;
		} else {
			fc->resp->refs = 1;
			fc->resp->held = pl->held;
			pl->held->refs++;
			km_fetch_walk_init(&fc->w, x->ver, total + fc->pre);
		}
	}
	if (fc->resp && !fc->dropped) {
		if (evbuffer_add_buffer(fc->resp->buf, chunk) != 0)
			fc->bad = true;
		fc->resp->size += n;
		pl->held->bytes += n;
		if (pl->rate > 0)
			pl->tokens -= (int64_t)n;
		fc->cur_valid = false; /* the buffer grew: the cursor is found again */
	}
	km_net_client_release(c, n);
	if (fc->resp && !fc->dropped && fc->sessions && !fc->session_done &&
	    evbuffer_get_length(fc->resp->buf) >= fc->pre + 10) {
		uint8_t h[10];
		struct evbuffer_ptr at;
		fc->session_done = true;
		if (evbuffer_ptr_set(fc->resp->buf, &at, fc->pre, EVBUFFER_PTR_SET) != 0 ||
		    evbuffer_copyout_from(fc->resp->buf, &at, h, sizeof(h)) != (ev_ssize_t)sizeof(h) ||
		    !take_session(pl, fc, h))
			fc->dropped = true;
	}
	if (fc->resp && !fc->dropped && (!fc->sessions || fc->session_done))
		walk_answer(fc);
	if (last) {
		km_pl_source_contact(pl, KM_OK, true);
		free(x);
		end_answer(fc, false);
	}
}

/*
 * In the mirror's pipeline, whether or not it can be fetched now: a session keeps it (docs/mirror.md,
 * "Fetch sessions").
 */
static bool session_member(const mpart *p, int32_t node)
{
	return p->state == KM_MP_MIRRORING && !p->settling && p->lead.src == node && p->plan.pid >= 0 &&
	       p->plan.fetch_logical >= 0;
}

/* Forget node's fetch session on lane: the next Fetch there is a full one (a new session). */
static void session_reset(km_pipeline *pl, int32_t node, unsigned lane)
{
	mnode_io *io = km_pl_node_io_find(pl->sio, pl->nsio, node, lane);
	if (io) {
		io->sess_id = 0;
		io->sess_epoch = 0;
	}
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			mpart *p = pl->topics[i]->parts[j];
			if (p && p->fetch.sess_node == node && p->fetch.sess_lane == lane)
				p->fetch.sess_node = -1;
		}
}

/* Whether p is in node's session on lane (the broker holds it there). */
static bool session_holds(const mpart *p, int32_t node, unsigned lane)
{
	return p->fetch.sess_node == node && p->fetch.sess_lane == lane;
}

/*
 * The fetch groups of a source broker that leads led of the pipeline's partitions: one, or with
 * sessions one per FETCH_SESSION_MAX, at most FETCH_GROUPS_MAX. A partition's group is a hash of its
 * topic's name and its id, so it stays while the count stays.
 */
static unsigned fetch_groups(const km_pipeline *pl, size_t led)
{
	size_t g = (led + FETCH_SESSION_MAX - 1) / FETCH_SESSION_MAX;
	if (!pl->sessions || g <= 1)
		return 1;
	return g > FETCH_GROUPS_MAX ? FETCH_GROUPS_MAX : (unsigned)g;
}

/*
 * The lane of group g's session. With several groups, lane 0 (km_cluster_node's, which the
 * pipeline's Metadata, ListOffsets and OffsetForLeaderEpoch take) carries none: those requests
 * would wait behind a session's long poll, and a start of 10,000 partitions went at a quarter of
 * its pace. The side lanes come after the sessions'.
 */
static unsigned group_lane(unsigned g, unsigned groups)
{
	return groups > 1 ? g + 1 : g;
}

static unsigned fetch_group_of(uint64_t topic_hash, int32_t partition, unsigned groups)
{
	uint32_t id = (uint32_t)partition;
	return groups <= 1 ? 0 : (unsigned)(km_fnv1a(topic_hash, &id, sizeof(id)) % groups);
}

/* A Fetch request being built: its topics, partitions and forgotten partitions (sized for the broker's partitions). */
typedef struct fetch_req {
	km_fetch_request m;
	km_fetch_request_fetch_topic *ft;
	km_fetch_request_fetch_partition *fp;
	km_fetch_request_forgotten_topic *fg;
	int32_t *fgp;
	size_t nt, np, nf, nfp;
	int32_t node;
	unsigned lane, group, groups; /* the lane it goes on, the group of partitions it fetches (of groups) */
	bool sessions, full;
} fetch_req;

static void fetch_req_free(fetch_req *r)
{
	free(r->ft);
	free(r->fp);
	free(r->fg);
	free(r->fgp);
}

/*
 * One partition in the request: ready ones are fetched at their fetch offset; with sessions, a
 * member not ready stays with a size of 0, and one the broker holds as it is is left out.
 */
static void fetch_req_part(km_pipeline *pl, fetch_req *r, fetch_ctx *fc, mpart *p, int64_t now)
{
	bool mine = p->lead.src == r->node && p->fetch.group == r->group;
	bool ready = mine && km_pl_fetchable(p, now) && fc->n < fc->cap;
	/*
	 * With several groups a partition not ready (writing) leaves its session until it is, as a
	 * consumer's buffered partitions do: one held at size 0 makes the broker walk the waiting
	 * Fetch's partitions on each of its appends without completing it, which at 10,000 partitions
	 * under load doubled the source broker's wait for its own producers (docs/mirror.md, "Fetch groups").
	 */
	bool member = mine && r->sessions && session_member(p, r->node) && (ready || r->groups <= 1);
	bool held = session_holds(p, r->node, r->lane);
	int64_t off;
	int32_t max;

	if (!ready && !member) {
		if (r->sessions && held) {
			r->fgp[r->nfp++] = p->id; /* it left the session (or the group) */
			p->fetch.sess_node = -1;
		}
		return;
	}
	if (ready) {
		fc->parts[fc->n++] = p;
		p->fetch.seq = pl->fetch_seq + 1;
		if (p->phase == PH_WRITING) {
			p->fetch.ahead = true; /* its phase stays WRITING */
		} else {
			km_pl_set_phase(p, PH_FETCHING, "in a Fetch");
		}
		p->plan.stop_answer = false;
	}
	off = ready || !held ? p->plan.fetch_logical : p->fetch.sess_offset;
	max = ready ? (int32_t)pl->part_max_bytes : 0;
	if (off < 0)
		off = 0; /* a member not started yet: no data is taken before it is ready */
	if (!r->full && held && p->fetch.sess_offset == off && p->fetch.sess_max == max &&
	    p->fetch.sess_lepoch == p->lead.src_epoch)
		return; /* the broker holds it as it is */
	km_fetch_request_fetch_partition_init(&r->fp[r->np]);
	r->fp[r->np].partition = p->id;
	r->fp[r->np].current_leader_epoch = p->lead.src_epoch;
	r->fp[r->np].fetch_offset = off;
	r->fp[r->np].log_start_offset = -1;
	r->fp[r->np].last_fetched_epoch = -1;
	r->fp[r->np].partition_max_bytes = max;
	r->np++;
	if (r->sessions) {
		p->fetch.sess_node = r->node;
		p->fetch.sess_lane = r->lane;
		p->fetch.sess_offset = off;
		p->fetch.sess_max = max;
		p->fetch.sess_lepoch = p->lead.src_epoch;
	}
}

/* Every topic's partitions in the request, grouped by topic. */
static void fetch_req_fill(km_pipeline *pl, fetch_req *r, fetch_ctx *fc, int64_t now)
{
	for (size_t i = 0; i < pl->ntopics; i++) {
		mtopic *t = pl->topics[i];
		size_t first = r->np, ffirst = r->nfp;
		for (int32_t j = 0; j < t->nparts; j++)
			if (t->parts[j])
				fetch_req_part(pl, r, fc, t->parts[j], now);
		if (r->np > first) {
			km_fetch_request_fetch_topic_init(&r->ft[r->nt]);
			r->ft[r->nt].topic = km_str_c(t->name);
			r->ft[r->nt].partitions.items = &r->fp[first];
			r->ft[r->nt].partitions.count = (int32_t)(r->np - first);
			r->nt++;
		}
		if (r->nfp > ffirst) {
			km_fetch_request_forgotten_topic_init(&r->fg[r->nf]);
			r->fg[r->nf].topic = km_str_c(t->name);
			r->fg[r->nf].partitions.items = &r->fgp[ffirst];
			r->fg[r->nf].partitions.count = (int32_t)(r->nfp - ffirst);
			r->nf++;
		}
	}
	r->m.topics.items = r->ft;
	r->m.topics.count = (int32_t)r->nt;
	r->m.forgotten_topics_data.items = r->fg;
	r->m.forgotten_topics_data.count = (int32_t)r->nf;
}

/* Send the request; its answer streams to on_fetch_stream. False: nothing was sent (fc is still the caller's). */
static bool fetch_req_send(km_pipeline *pl, km_net_client *c, fetch_req *r, fetch_ctx *fc, int16_t ver)
{
	km_net_request rq;
	km_net_piece pc;
	req_ctx *x;
	km_wr w;
	bool ok = false;

	km_wr_init(&w);
	km_fetch_request_encode(&w, ver, &r->m);
	x = km_pl_ctx_new(pl, pl->src, r->node, ver);
	if (km_wr_ok(&w) && x) {
		x->extra = fc;
		pc = (km_net_piece){.p = w.buf, .len = w.len};
		km_net_request_init(&rq, KM_API_FETCH, ver);
		rq.pieces = &pc;
		rq.npieces = 1;
		rq.delivery = KM_NET_STREAM;
		rq.on_stream = on_fetch_stream;
		rq.arg = x;
		ok = km_net_client_request(c, &rq) == KM_OK;
		if (!ok)
			km_cluster_drop(pl->src, c);
	}
	if (!ok)
		free(x);
	km_wr_free(&w);
	return ok;
}

/*
 * One Fetch to source broker node on lane, for the partitions of group (of groups): nready of them
 * ready, total the most a request names. With a fetch session (KIP-227, Fetch v7+; on the group's
 * session lane, group_lane) the request names only what changed since the last one on the lane: a
 * partition new to the session, or whose fetch offset, size or leader epoch differs from what the
 * broker holds; partitions that left (paused, stopped, moved to another leader) are forgotten. A
 * partition still writing its last batches stays in the session with a size of 0 when the broker
 * has one group, so the broker keeps it without sending its data again (a batch it sends anyway is
 * dropped: the partition does not take data then); with several it leaves until it is ready
 * (fetch_req_part). The answer is taken only by the partitions that were ready when it was sent,
 * and each of those was sent, or left, at its fetch offset.
 */
static void send_group(km_pipeline *pl, int32_t node, unsigned lane, unsigned group, unsigned groups, size_t nready,
		       size_t total, int64_t now, int64_t *next)
{
	bool session_lane = lane == group_lane(group, groups);
	mnode_io *io = km_pl_node_io(&pl->sio, &pl->nsio, node, lane);
	km_net_client *c;
	fetch_req r = {.node = node, .lane = lane, .group = group, .groups = groups};
	fetch_ctx *fc = NULL;
	int16_t ver;

	if (!io)
		return;
	c = km_cluster_lane(pl->src, node, lane);
	if (!c) {
		pl->src_meta_need = true;
		return;
	}
	if (!km_cluster_usable(pl->src, c))
		return;
	if ((ver = km_net_version_pick(c, KM_API_FETCH, FETCH_LO, FETCH_HI)) < 0) {
		KM_ERROR(COMP, 0, "%s: source broker %d does not support Fetch v%d-%d", pl->name, (int)node, FETCH_LO,
			 FETCH_HI);
		return;
	}
	r.sessions = session_lane && ver >= 7 && pl->sessions;
	r.full = !r.sessions || io->sess_id == 0;
	if (r.full && session_lane)
		session_reset(pl, node, lane);
	if (now < io->quiet_until && nready <= io->quiet_ready) {
		if (io->quiet_until < *next)
			*next = io->quiet_until;
		return;
	}
	fc = calloc(1, sizeof(*fc));
	r.ft = calloc(pl->ntopics, sizeof(*r.ft));
	r.fp = calloc(total, sizeof(*r.fp));
	r.fg = calloc(pl->ntopics, sizeof(*r.fg));
	r.fgp = calloc(total, sizeof(*r.fgp));
	if (!fc || !r.ft || !r.fp || !r.fg || !r.fgp || !(fc->parts = calloc(nready, sizeof(*fc->parts))) ||
	    !(fc->later = calloc(nready, sizeof(*fc->later)))) {
		if (fc)
			fetch_ctx_free(fc);
		fetch_req_free(&r);
		return;
	}
	fc->pl = pl;
	fc->cap = nready;
	km_fetch_request_init(&r.m);
	r.m.replica_id = -1;
	r.m.max_wait_ms = FETCH_MAX_WAIT_MS;
	r.m.min_bytes = 1;
	/* The sessions' Fetches share mirror.fetch.max.bytes: the memory bound counts one per lane kind. */
	r.m.max_bytes = (int32_t)(session_lane ? pl->fetch_max_bytes / groups : pl->fetch_max_bytes);
	r.m.isolation_level = 0;
	/* A full request opens a session (id 0, epoch 0) where sessions are used, else none (epoch -1). */
	r.m.session_id = r.full ? 0 : io->sess_id;
	r.m.session_epoch = !r.sessions ? -1 : r.full ? 0 : io->sess_epoch;
	fetch_req_fill(pl, &r, fc, now);
	fc->node = node;
	fc->lane = lane;
	fc->sent_at = now;
	fc->seq = ++pl->fetch_seq;
	fc->full = r.full;
	fc->sessions = r.sessions;
	if (fetch_req_send(pl, c, &r, fc, ver)) {
		/* io again: the sends above may have grown the array it points into */
		if ((io = km_pl_node_io(&pl->sio, &pl->nsio, node, lane)))
			io->fetching = true;
		for (size_t i = 0; i < fc->n; i++)
			pl->fetch_ahead += fc->parts[i]->fetch.ahead;
		if (!session_lane)
			pl->fetch_side++;
		else if (r.full)
			pl->fetch_full++;
		else
			pl->fetch_incremental++;
	} else {
		for (size_t i = 0; i < fc->n; i++) {
			if (fc->parts[i]->fetch.ahead)
				fc->parts[i]->fetch.ahead = false;
			else
				km_pl_set_phase(fc->parts[i], PH_READY, "the Fetch could not be sent");
		}
		if (r.sessions)
			session_reset(pl, node, lane); /* what the broker holds is not known now */
		fetch_ctx_free(fc);
	}
	fetch_req_free(&r);
}

/*
 * The Fetches to source broker node: one per group of its partitions with some ready, on the
 * group's session lane, or, while that one's Fetch is out, on an idle side lane (docs/mirror.md,
 * "Fetch sessions", "Side Fetches").
 */
void km_pl_send_fetch(km_pipeline *pl, int32_t node, int64_t now, int64_t *next)
{
	size_t led = 0, total = 0, nready[FETCH_GROUPS_MAX] = {0};
	unsigned groups;
	mnode_io *io;

	if (pl->held->bytes >= pl->held_cap)
		return; /* memory is bounded by the fetch sizes, not by the lag */
	if ((io = km_pl_node_io_find(pl->sio, pl->nsio, node, 0)) && io->groups) {
		/* Every lane of the groups as they were busy: nothing to send (the passes below are not free). */
		unsigned gs = io->groups, first_side = group_lane(gs, gs);
		bool idle = false;
		for (unsigned l = 0; l < gs + FETCH_SIDE_LANES && !idle; l++) {
			mnode_io *x = km_pl_node_io_find(pl->sio, pl->nsio, node,
							 l < gs ? group_lane(l, gs) : first_side + (l - gs));
			idle = !x || !x->fetching;
		}
		if (!idle)
			return;
	}
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++)
			led += pl->topics[i]->parts[j] && pl->topics[i]->parts[j]->lead.src == node;
	groups = fetch_groups(pl, led);
	if (!(io = km_pl_node_io(&pl->sio, &pl->nsio, node, 0)))
		return;
	if (io->groups != groups) {
		/* The partitions' groups change: every session with the broker starts over. */
		io->groups = groups;
		for (unsigned l = 0; l <= FETCH_GROUPS_MAX; l++)
			session_reset(pl, node, l);
	}
	for (size_t i = 0; i < pl->ntopics; i++) {
		mtopic *t = pl->topics[i];
		uint64_t h = km_fnv1a(KM_FNV1A_INIT, t->name, strlen(t->name));
		for (int32_t j = 0; j < t->nparts; j++) {
			mpart *p = t->parts[j];
			if (!p)
				continue;
			if (p->lead.src == node) {
				p->fetch.group = fetch_group_of(h, p->id, groups);
				if (km_pl_fetchable(p, now))
					nready[p->fetch.group]++;
			}
			if (p->lead.src == node || p->fetch.sess_node == node)
				total++;
		}
	}
	for (unsigned g = 0; g < groups; g++) {
		unsigned lane = group_lane(g, groups), first_side = group_lane(groups, groups);
		if (!nready[g])
			continue; /* nothing to read: the session waits as it is */
		io = km_pl_node_io(&pl->sio, &pl->nsio, node, lane);
		if (io && io->fetching) { /* the session's Fetch is out: a side Fetch, on an idle side lane */
			io = NULL;
			for (unsigned l = first_side; l < first_side + FETCH_SIDE_LANES && !io; l++) {
				mnode_io *side = km_pl_node_io(&pl->sio, &pl->nsio, node, l);
				if (side && !side->fetching) {
					io = side;
					lane = l;
				}
			}
		}
		if (!io)
			continue;
		if (pl->held->bytes >= pl->held_cap)
			return;
		send_group(pl, node, lane, g, groups, nready[g], total, now, next);
	}
}
