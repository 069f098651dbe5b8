/*
 * A mirror's pipeline (docs/mirror.md, "The pipeline"): fetch record batches from the source,
 * write the same batches into the destination as the mirror's own idempotent producer, keep the
 * offset maps, reconcile after anything uncertain.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "kmirror/api.h"
#include "kmirror/batch.h"
#include "kmirror/crc32c.h"
#include "kmirror/fetch.h"
#include "kmirror/hash.h"
#include "kmirror/log.h"
#include "kmirror/msg/delete_records_request.h"
#include "kmirror/msg/delete_records_response.h"
#include "kmirror/msg/fetch_request.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/init_producer_id_request.h"
#include "kmirror/msg/init_producer_id_response.h"
#include "kmirror/msg/last_mirrored_offsets_request.h"
#include "kmirror/msg/last_mirrored_offsets_response.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "kmirror/msg/list_transactions_request.h"
#include "kmirror/msg/list_transactions_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/produce_response.h"
#include "mirror_int.h"

#define COMP KM_MIRROR_COMP

/* Produce requests in flight per destination broker: in order on one connection (idempotence keeps 5). */
#define KM_MIRROR_PRODUCE_INFLIGHT 5
/* Bytes of batches one Produce request carries at most (its partitions' batches add up to this). */
#define PRODUCE_REQUEST_BYTES (8 << 20)
#define FETCH_MAX_WAIT_MS 500
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 10000
#define METADATA_MIN_INTERVAL_MS 500
#define MAX_BATCH_BYTES (64 << 20)
/* A partition whose destination writes keep failing (retriable errors, reconciles) this long goes FAILED. */
#define KM_MIRROR_FAIL_AFTER_MS 300000
/* How often a paused partition's source end is read (for its lag). */
#define PAUSED_WATCH_MS 2000
/* Metadata answers in a row without a topic that was mirrored before it counts as deleted at the source. */
#define SOURCE_GONE_ROUNDS 3

/* The versions this code speaks: [lo, hi] of each request it builds (Fetch and Produce name topics, v12 at most). */
enum { FETCH_LO = 4, FETCH_HI = 12, PRODUCE_LO = 3, PRODUCE_HI = 12, META_LO = 1, META_HI = 12, LO_LO = 1,
       LO_HI = 10, PID_LO = 0, PID_HI = 5, LT_LO = 0, LT_HI = 1 };
/* A transactional batch goes with Produce v11 at most: transaction version 1 (txn.c). */
#define PRODUCE_TXN_HI 11
/* How soon a marker's landing is looked at again while the coordinator has not written it yet. */
#define MARKER_POLL_MS 5
/* How long partitions wait for ListTransactions to reach every destination broker before going on without it. */
#define TXL_PATIENCE_MS 10000

typedef enum {
	PH_IDLE,       /* not run (paused, stopped, failed, or waiting for its committed state) */
	/* PH_RECONCILE to PH_FENCE: reconcile, which a pausing or stopping partition finishes before it settles */
	PH_RECONCILE,  /* waiting for a producer id and the destination leader, then ListOffsets on it */
	PH_RECON_WAIT, /* ListOffsets on the destination sent */
	PH_RECON_LSO,  /* then ListOffsets READ_COMMITTED: the last stable offset */
	PH_RECON_ABORTED, /* a READ_COMMITTED Fetch at the hide point: aborted transactions spanning it */
	PH_FENCE,      /* its transactional ids being initialised again (what they held open is aborted) */
	PH_START,      /* no run yet: ListOffsets on the source for the start position */
	PH_START_WAIT,
	PH_READY,      /* may be fetched */
	PH_FETCHING,   /* in a Fetch in flight */
	PH_RUNS,       /* new runs being persisted before its batches go out */
	PH_WRITING,    /* batches being produced */
} mphase;

/*
 * The bytes of fetched responses a mirror holds: shared by the pipeline and its responses, since
 * a response's last reference may go after the pipeline (the client releases pieces late).
 */
typedef struct mheld {
	size_t bytes;
	int refs;
} mheld;

static void held_unref(mheld *h)
{
	if (--h->refs == 0)
		free(h);
}

/* A fetched response, held while batches that reference its bytes are written. */
typedef struct mresp {
	struct evbuffer *buf;
	int refs;
	size_t size;
	mheld *held;
} mresp;

typedef struct mbatch {
	struct mbatch *next;
	mresp *resp;      /* the record bytes live in resp->buf's chains (vec below) */
	size_t size;      /* the whole batch, 12 + batchLength */
	uint8_t *own;     /* or in own (a re-encoded piece), own_len bytes */
	size_t own_len;
	struct evbuffer_iovec *vec; /* the record bytes (from 61 on) in resp->buf's chains, found once */
	int nvec;
	uint8_t hdr[KM_BATCH_HEADER_SIZE]; /* re-stamped header */
	int64_t logical;  /* first logical offset */
	int32_t count;    /* lastOffsetDelta + 1 */
	int64_t physical; /* where it must land */
	int64_t max_ts;
	bool lat;         /* LogAppendTime at the source: hdr made CreateTime (its run says so) */
	bool sent;
	uint8_t kind;     /* BK_* */
	bool commit;      /* BK_MARKER: the source's marker commits (else aborts) */
	int txi;          /* BK_TXN, BK_MARKER: the partition's transactional producer (mpart.tx) */
	uint8_t mk;       /* BK_MARKER: 0 waiting, 1 EndTxn sent, 2 its landing asked */
	int64_t mk_at;    /* BK_MARKER: when the landing is asked again */
} mbatch;

enum {
	BK_DATA,   /* written by the mirror's idempotent producer */
	BK_TXN,    /* a source transaction's data: written inside a destination transaction (mpart.tx) */
	BK_MARKER, /* a source COMMIT/ABORT marker: the destination transaction ends, its marker lands here */
};

/* A destination transactional producer of the partition and the source transaction it carries. */
typedef struct mtx {
	km_txp *txp;
	int64_t src_pid; /* -1: free */
	bool begun;      /* km_txp_begin called for the current source transaction */
	int64_t first_logical; /* where that transaction's first batch is (-1: none planned yet) */
} mtx;

typedef struct mtopic mtopic;

typedef struct mpart {
	mtopic *t;
	int32_t id;
	km_mp_state state;   /* committed */
	mphase phase;
	bool settling;       /* a transition asked of the driver, not yet committed */
	int32_t src_leader, src_epoch, dst_leader;
	int64_t fetch_logical;  /* the logical tail: the next offset to fetch */
	int64_t cont_logical;   /* the logical offset that continues the open run at plan_phys; -1: a run must start */
	bool cont_lat;          /* the open run is a LogAppendTime one (a batch of the other kind starts a run) */
	int64_t plan_phys;      /* where the next planned batch lands */
	int64_t acked_phys;     /* the physical tail: after the last acknowledged batch */
	int64_t acked_logical;  /* the logical tail matching acked_phys (holes after it included once planned) */
	int64_t pid;
	int16_t epoch;
	int32_t seq;
	bool probe;             /* the first write after reconcile goes alone and checks where it landed */
	bool need_pid;          /* waits for a fresh producer id */
	bool recon;             /* reconcile once nothing is in flight */
	bool oor;               /* the source answered OFFSET_OUT_OF_RANGE: look up its log start */
	bool start_latest;      /* no record at or after the start timestamp: start at the end */
	int64_t hide_logical;   /* a batch landed where it was not planned: hide from its logical start (-1: none) */
	int64_t first_logical;  /* where a fresh start began (the source's answer), -1: resumed from runs */
	int64_t src_ls;         /* the source's log start offset, as last fetched (-1: not known) */
	int64_t dst_ls;         /* the logical log start the destination was moved to (-1: never) */
	bool ls_inflight, ls_unsupported; /* a DeleteRecords in flight; the destination refuses them (compacted) */
	bool watch_inflight;    /* paused: a ListOffsets for the source's end in flight */
	int64_t watch_at;
	mbatch *head, *tail;
	size_t inflight;        /* batches sent, not answered */
	int64_t retry_at;
	int backoff_ms;
	int64_t failing_since;  /* the first of a run of destination errors with nothing written since (0: none) */
	uint64_t records, bytes, batches, skipped, errors;
	uint64_t lag, lag_ms;   /* gauges, set on every fetch answer */
	uint64_t fetch_seq;     /* the Fetch it is in (fetch_ctx.seq) */
	bool taken;             /* its data in the current answer was taken (a partition listed twice is not) */
	int32_t sess_node;      /* the source broker whose fetch session holds it, -1: none */
	int64_t sess_offset;    /* what that session holds for it: fetch offset, size, leader epoch */
	int32_t sess_max, sess_lepoch;
	int64_t source_end;     /* the source's high watermark as last fetched; -1: not known */
	int64_t newest_ts;      /* max timestamp of the last batch written */
	bool metrics;           /* its series are registered */
	mtx *tx;                /* its transactional producers (docs/mirror.md, "Transactions") */
	size_t ntx;
	bool stop_answer;       /* a marker it holds at: the rest of this answer is not taken */
	bool tx_fenced;         /* its transactional ids of earlier lives were initialised again */
	bool fence_started;
	int64_t recon_end;      /* reconcile: the destination's log end, while its last stable offset is asked */
	int64_t recon_hide;     /* reconcile: the physical offset the hidden range starts at, being settled */
	int64_t peer_offset;    /* failback: the source's kmirrord mirrored this partition from here up to it (-1: no) */
	char peer_state[16];    /* and its state there */
	int fb_check;           /* failback: 0 not checked, 1 probes out, 2 the same records, -1 not decidable */
	int fb_pending;         /* its probes not answered yet */
	uint64_t fb_hash[2];    /* the record before the failback point: here [0], at the source [1] (0: none) */
} mpart;

struct mtopic {
	char *name;
	mpart **parts; /* by partition id */
	int32_t nparts;
	bool src_missing, dst_missing;
	int src_missing_rounds;  /* Metadata answers in a row without the source topic */
	int32_t src_partitions;  /* the source's partition count, as last read */
	/* Failback: what the source's kmirrord says it mirrored of the topic (LastMirroredOffsets). */
	int peer;                /* PEER_* */
};

enum {
	PEER_UNKNOWN, /* not asked yet */
	PEER_ASKED,
	PEER_KNOWN,   /* the source's kmirrord answered: partitions' peer_offset are set */
	PEER_NONE,    /* a plain Kafka source, or the topic is not mirrored there: a fresh start */
};

typedef struct mnode_io {
	int32_t id;
	bool fetching;
	int produce_inflight;
	int32_t sess_id, sess_epoch; /* the source broker's fetch session (KIP-227); id 0: none */
} mnode_io;

struct km_pipeline {
	km_mirror *mi;
	char *name;
	km_mcluster *src, *dst;
	SSL_CTX *src_tls;
	mtopic **topics;
	size_t ntopics;
	mnode_io *sio, *dio;
	size_t nsio, ndio;
	struct event *tick_ev;
	bool tick_armed;
	bool src_meta_inflight, dst_meta_inflight, src_meta_need, dst_meta_need;
	int64_t src_meta_at, dst_meta_at;
	bool pid_inflight, pid_want;
	int64_t pid;
	int16_t epoch;
	uint64_t pid_gen; /* bumps with every producer id obtained */
	uint64_t fetch_seq;
	int64_t fetch_max_bytes, part_max_bytes;
	bool sessions;                      /* mirror.fetch.sessions */
	uint64_t fetch_full, fetch_incremental; /* Fetch requests sent, by kind (kmirror_mirror_fetch_requests_total) */
	char start_mode[32];
	int64_t options_at;
	int64_t meta_interval; /* mirror.metadata.refresh.interval.ms: leaders, partition counts */
	/* mirror.replication.throttled.rate: a token bucket over fetched bytes (0: no limit). */
	int64_t rate, tokens, tokens_at;
	mheld *held; /* fetched bytes held: no new fetch while above held_cap */
	size_t held_cap;
	bool closing;
	bool config_error;
	char config_msg[256];
	/* The destination's transactional ids of this mirror, from ListTransactions on every broker. */
	int txl;        /* 0 not asked, 1 asked, 2 known, 3 the destination cannot list them (before 3.0) */
	int txl_pending;
	uintptr_t txl_gen; /* answers of an earlier round are dropped */
	int64_t txl_at, txl_since; /* the last round; the first (0: none yet) */
	char **listed;
	size_t nlisted;
};

/* ---- small things ---- */

static int64_t now_ms(void)
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static int16_t pick(km_net_client *c, int16_t key, int16_t lo, int16_t hi)
{
	int16_t v = km_net_client_version(c, key);
	if (v < lo)
		return -1;
	return v > hi ? hi : v;
}

static void resp_unref(void *arg)
{
	mresp *r = arg;
	if (--r->refs == 0) {
		r->held->bytes -= r->size;
		held_unref(r->held);
		evbuffer_free(r->buf);
		free(r);
	}
}

static void batch_free(mbatch *b)
{
	if (b->resp)
		resp_unref(b->resp);
	free(b->vec);
	free(b->own);
	free(b);
}

static void schedule_in(km_pipeline *pl, int64_t ms);
static void update_lag(mpart *p, int64_t now);
static void reread_options(km_pipeline *pl, int64_t now);

static void tick_soon(km_pipeline *pl)
{
	schedule_in(pl, 0);
}

static const char *ptag(const mpart *p, char *buf, size_t len)
{
	snprintf(buf, len, "%s-%d", p->t->name, (int)p->id);
	return buf;
}

static mnode_io *node_io(mnode_io **arr, size_t *n, int32_t id)
{
	mnode_io *a;
	for (size_t i = 0; i < *n; i++)
		if ((*arr)[i].id == id)
			return &(*arr)[i];
	a = realloc(*arr, (*n + 1) * sizeof(*a));
	if (!a)
		return NULL;
	*arr = a;
	a[*n] = (mnode_io){.id = id};
	return &a[(*n)++];
}

static mtopic *topic_get(km_pipeline *pl, const char *name, bool create)
{
	mtopic *t, **nt;
	for (size_t i = 0; i < pl->ntopics; i++)
		if (!strcmp(pl->topics[i]->name, name))
			return pl->topics[i];
	if (!create)
		return NULL;
	t = calloc(1, sizeof(*t));
	nt = realloc(pl->topics, (pl->ntopics + 1) * sizeof(*nt));
	if (!t || !nt || !(t->name = strdup(name))) {
		free(t);
		if (nt)
			pl->topics = nt;
		return NULL;
	}
	pl->topics = nt;
	pl->topics[pl->ntopics++] = t;
	return t;
}

static void register_series(km_pipeline *pl, mpart *p)
{
	const km_mirror_families *f = km_mirror_metric_families(pl->mi);
	char part[16];
	const char *v[] = {pl->name, p->t->name, part};
	struct {
		km_metric_family *f;
		const uint64_t *value;
	} s[] = {{f->records, &p->records}, {f->bytes, &p->bytes}, {f->batches, &p->batches}, {f->lag, &p->lag},
		 {f->lag_ms, &p->lag_ms}, {f->skipped, &p->skipped}, {f->errors, &p->errors}};

	snprintf(part, sizeof(part), "%d", (int)p->id);
	for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
		if (s[i].f && !km_metric_series_ptr(s[i].f, v, s[i].value))
			KM_DEBUG(COMP, 0, "%s/%s-%s: a metric series was not kept (the family is full)", pl->name,
				 p->t->name, part);
}

/* The lag gauges, from the source's end and what is mirrored. */
static void update_lag(mpart *p, int64_t now)
{
	int64_t mirrored = p->acked_logical;
	p->lag = p->source_end > mirrored && mirrored >= 0 ? (uint64_t)(p->source_end - mirrored) : 0;
	p->lag_ms = p->lag && p->newest_ts > 0 && now > p->newest_ts ? (uint64_t)(now - p->newest_ts) : 0;
}

static mpart *part_get(km_pipeline *pl, mtopic *t, int32_t id, bool create)
{
	mpart *p;
	if (id < 0 || id > 1000000)
		return NULL;
	if (id < t->nparts && t->parts[id])
		return t->parts[id];
	if (!create)
		return NULL;
	if (id >= t->nparts) {
		mpart **np = realloc(t->parts, (size_t)(id + 1) * sizeof(*np));
		if (!np)
			return NULL;
		memset(np + t->nparts, 0, (size_t)(id + 1 - t->nparts) * sizeof(*np));
		t->parts = np;
		t->nparts = id + 1;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->t = t;
	p->id = id;
	p->src_leader = p->dst_leader = -1;
	p->src_epoch = -1;
	p->fetch_logical = p->cont_logical = -1;
	p->hide_logical = -1;
	p->first_logical = -1;
	p->src_ls = p->dst_ls = -1;
	p->pid = -1;
	p->peer_offset = -1;
	p->source_end = -1;
	p->sess_node = -1;
	t->parts[id] = p;
	register_series(pl, p);
	return p;
}

static void drop_unsent(mpart *p)
{
	mbatch **pp = &p->head;
	p->tail = NULL;
	while (*pp) {
		mbatch *b = *pp;
		if (b->sent) {
			p->tail = b;
			pp = &b->next;
			continue;
		}
		*pp = b->next;
		batch_free(b);
	}
}

static void set_tail(km_pipeline *pl, mpart *p, bool set)
{
	km_offmap *m = km_state_offmap_mut(km_mirror_store(pl->mi), p->t->name, p->id);
	if (!m)
		return;
	m->tail_physical = set ? p->acked_phys : -1;
	m->tail_logical = set ? p->acked_logical : -1;
	if (set)
		update_lag(p, now_ms());
}

static void backoff(mpart *p)
{
	int ms = p->backoff_ms ? p->backoff_ms : BACKOFF_MIN_MS;
	p->backoff_ms = ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : ms * 2;
	/* Jitter: 75-125 % of the step, so partitions that failed together do not retry together. */
	ms = ms * 3 / 4 + (int)(random() % (ms / 2 + 1));
	p->retry_at = now_ms() + ms;
}

/* Start over for p: once nothing of it is in flight, reconcile with a fresh producer id. */
static void fail_part(km_pipeline *pl, mpart *p, const char *why);

static void reconcile(km_pipeline *pl, mpart *p, const char *why)
{
	char tag[300];
	if (p->phase == PH_IDLE)
		return;
	int64_t now = now_ms();
	if (!p->failing_since)
		p->failing_since = now;
	else if (now - p->failing_since > KM_MIRROR_FAIL_AFTER_MS) {
		/* Retrying has not written anything for this long: an operator has to look. */
		char msg[600];
		snprintf(msg, sizeof(msg), "%s (retried for %lld s without writing anything)", why,
			 (long long)(now - p->failing_since) / 1000);
		p->failing_since = 0;
		fail_part(pl, p, msg);
		return;
	}
	KM_INFO(COMP, 0, "%s/%s: %s: reconciling", pl->name, ptag(p, tag, sizeof(tag)), why);
	p->errors++;
	drop_unsent(p);
	p->recon = true;
	p->phase = PH_RECONCILE;
	p->need_pid = true;
	pl->pid_want = true;
	backoff(p);
	tick_soon(pl);
}

static void fail_part(km_pipeline *pl, mpart *p, const char *why)
{
	char tag[300];
	KM_ERROR(COMP, 0, "%s/%s: %s: the partition is FAILED (stop, then start, to recover)", pl->name,
		 ptag(p, tag, sizeof(tag)), why);
	drop_unsent(p);
	p->phase = PH_IDLE; /* the tail stays until FAILED is in: its record keeps where the mirror stood */
	if (!p->settling) {
		p->settling = true;
		km_mirror_settle(pl->mi, pl->name, p->t->name, p->id, p->state, KM_MP_FAILED, why);
	}
}

/* ---- metadata (both sides) ---- */

typedef struct req_ctx {
	km_pipeline *pl;
	km_mcluster *cl;
	int32_t node;
	int16_t ver;
	void *extra;
} req_ctx;

static req_ctx *ctx_new(km_pipeline *pl, km_mcluster *cl, int32_t node, int16_t ver)
{
	req_ctx *x = calloc(1, sizeof(*x));
	if (x)
		*x = (req_ctx){pl, cl, node, ver, NULL};
	return x;
}

/* km_mcluster_send with the request's context: freed here when the send fails. */
static km_err send_flat(km_net_client *c, int16_t key, int16_t ver, km_wr *w, km_net_response_cb cb, req_ctx *x)
{
	km_err rc;

	if (!x) {
		km_wr_free(w);
		return KM_ERR_NOMEM;
	}
	if ((rc = km_mcluster_send(c, key, ver, w, cb, x)) != KM_OK)
		free(x);
	return rc;
}

static void take_metadata(km_pipeline *pl, km_mcluster *cl, const km_metadata_response *r)
{
	bool src = cl == pl->src;
	char tag[300];

	if (km_mcluster_brokers(cl, r) != KM_OK)
		return;
	for (int32_t i = 0; i < r->topics.count; i++) {
		const km_metadata_response_topic *mt = &r->topics.items[i];
		char name[256];
		mtopic *t;
		snprintf(name, sizeof(name), "%.*s", mt->name.len > 0 ? (int)mt->name.len : 0, mt->name.p);
		if (!(t = topic_get(pl, name, false)))
			continue;
		if (src) {
			t->src_missing = mt->error_code == 3;
			t->src_missing_rounds = t->src_missing ? t->src_missing_rounds + 1 : 0;
			if (!mt->error_code) {
				t->src_partitions = mt->partitions.count;
				/* The source grew: the destination and the store follow (a no-op when they have as many). */
				km_mirror_grow(pl->mi, pl->name, name, mt->partitions.count);
			}
		} else
			t->dst_missing = mt->error_code == 3;
		if (mt->error_code)
			continue;
		for (int32_t j = 0; j < mt->partitions.count; j++) {
			const km_metadata_response_partition *mp = &mt->partitions.items[j];
			mpart *p = part_get(pl, t, mp->partition_index, false);
			if (!p)
				continue;
			if (src) {
				p->src_leader = mp->error_code ? -1 : mp->leader_id;
				p->src_epoch = mp->leader_epoch;
			} else {
				if (p->dst_leader >= 0 && p->dst_leader != mp->leader_id && p->phase >= PH_READY &&
				    (p->head || p->inflight))
					/* Leadership moved under our writes: what landed is decided by the log. */
					reconcile(pl, p, "the destination leader moved");
				p->dst_leader = mp->error_code ? -1 : mp->leader_id;
			}
		}
	}
	for (size_t i = 0; i < pl->ntopics; i++) {
		mtopic *t = pl->topics[i];
		for (int32_t j = 0; j < t->nparts; j++) {
			mpart *p = t->parts[j];
			if (!p || p->phase == PH_IDLE)
				continue;
			if (!src && t->dst_missing)
				fail_part(pl, p, "the destination topic does not exist (create it with the source's partition count)");
			else if (src && t->src_missing && p->cont_logical >= 0 && p->state == KM_MP_MIRRORING &&
				 t->src_missing_rounds >= SOURCE_GONE_ROUNDS && !p->settling) {
				/* It was mirrored and is gone: the source topic was deleted. The mirror stops. */
				KM_WARN(COMP, 0, "%s/%s: the source topic was deleted: stopping the partition", pl->name,
					ptag(p, tag, sizeof(tag)));
				p->settling = true;
				km_mirror_settle(pl->mi, pl->name, t->name, p->id, KM_MP_MIRRORING, KM_MP_STOPPING, NULL);
			} else if (src && t->src_missing && t->src_missing_rounds == 1) {
				KM_WARN(COMP, 0, "%s/%s: the source has no such topic (yet): waiting for it", pl->name,
					ptag(p, tag, sizeof(tag)));
			}
		}
	}
}

static void on_metadata(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	km_mcluster *cl = x->cl;
	int16_t ver = x->ver;
	km_metadata_response r;
	km_arena a;
	km_rd rd;

	free(x);
	if (pl->closing)
		return;
	if (cl == pl->src)
		pl->src_meta_inflight = false;
	else
		pl->dst_meta_inflight = false;
	if (err != KM_OK) {
		KM_WARN(COMP, 0, "%s: %s Metadata failed: %s", pl->name, km_mcluster_side(cl), km_err_name(err));
		km_mcluster_drop(cl, c);
		schedule_in(pl, BACKOFF_MIN_MS * 5);
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&rd, body, len);
	if (km_metadata_response_decode(&rd, ver, &r, &a) == KM_OK)
		take_metadata(pl, cl, &r);
	km_arena_free(&a);
	tick_soon(pl);
}

static void send_metadata(km_pipeline *pl, km_mcluster *cl)
{
	km_net_client *c = km_mcluster_any(cl);
	km_metadata_request m;
	km_metadata_request_topic *ts;
	km_wr w;
	int16_t ver;
	bool *inflight = cl == pl->src ? &pl->src_meta_inflight : &pl->dst_meta_inflight;

	if (!km_mcluster_usable(cl, c))
		return; /* the cluster's on_change ticks again once it is ready */
	if ((ver = pick(c, KM_API_METADATA, META_LO, META_HI)) < 0) {
		KM_ERROR(COMP, 0, "%s: the %s cluster does not support Metadata v%d+", pl->name, km_mcluster_side(cl),
			 META_LO);
		return;
	}
	ts = calloc(pl->ntopics ? pl->ntopics : 1, sizeof(*ts));
	if (!ts)
		return;
	km_metadata_request_init(&m);
	for (size_t i = 0; i < pl->ntopics; i++) {
		km_metadata_request_topic_init(&ts[i]);
		ts[i].name = km_str_c(pl->topics[i]->name);
	}
	m.topics.items = ts;
	m.topics.count = (int32_t)pl->ntopics;
	m.allow_auto_topic_creation = false;
	km_wr_init(&w);
	km_metadata_request_encode(&w, ver, &m);
	free(ts);
	if (send_flat(c, KM_API_METADATA, ver, &w, on_metadata, ctx_new(pl, cl, -1, ver)) == KM_OK) {
		*inflight = true;
		if (cl == pl->src) {
			pl->src_meta_need = false;
			pl->src_meta_at = now_ms();
		} else {
			pl->dst_meta_need = false;
			pl->dst_meta_at = now_ms();
		}
	} else {
		km_mcluster_drop(cl, c);
	}
}

/* ---- the mirror's producer id on the destination ---- */

static void on_pid(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	int16_t ver = x->ver;
	km_init_producer_id_response r;
	km_arena a;
	km_rd rd;
	km_err rc;

	free(x);
	if (pl->closing)
		return;
	pl->pid_inflight = false;
	if (err != KM_OK) {
		km_mcluster_drop(pl->dst, c);
		schedule_in(pl, BACKOFF_MIN_MS * 5);
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&rd, body, len);
	rc = km_init_producer_id_response_decode(&rd, ver, &r, &a);
	km_arena_free(&a);
	if (rc != KM_OK || r.error_code) {
		KM_WARN(COMP, 0, "%s: InitProducerId on the destination failed: %s", pl->name,
			km_err_name(rc != KM_OK ? rc : (km_err)r.error_code));
		schedule_in(pl, BACKOFF_MAX_MS / 4);
		return;
	}
	pl->pid = r.producer_id;
	pl->epoch = r.producer_epoch;
	pl->pid_gen++;
	KM_DEBUG(COMP, 0, "%s: writing as producer id %lld epoch %d", pl->name, (long long)pl->pid, pl->epoch);
	/* Partitions waiting for a fresh id take this one. */
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			mpart *p = pl->topics[i]->parts[j];
			if (p && p->need_pid && !p->inflight) {
				p->need_pid = false;
				p->pid = pl->pid;
				p->epoch = pl->epoch;
				p->seq = 0;
			}
		}
	tick_soon(pl);
}

static void send_pid(km_pipeline *pl)
{
	km_net_client *c = km_mcluster_any(pl->dst);
	km_init_producer_id_request m;
	km_wr w;
	int16_t ver;

	if (!km_mcluster_usable(pl->dst, c))
		return;
	if ((ver = pick(c, KM_API_INIT_PRODUCER_ID, PID_LO, PID_HI)) < 0)
		return;
	km_init_producer_id_request_init(&m);
	m.transactional_id = KM_STR_NULL;
	m.transaction_timeout_ms = 60000;
	m.producer_id = -1;
	m.producer_epoch = -1;
	km_wr_init(&w);
	km_init_producer_id_request_encode(&w, ver, &m);
	if (send_flat(c, KM_API_INIT_PRODUCER_ID, ver, &w, on_pid, ctx_new(pl, pl->dst, -1, ver)) == KM_OK) {
		pl->pid_inflight = true;
		pl->pid_want = false;
	} else {
		km_mcluster_drop(pl->dst, c);
	}
}

/* ---- transactions: the partition's destination transactional producers ---- */

static void on_cluster_change(void *arg);

/* kmirror/<instance>/<mirror>/<topic>/<partition>/<k>: a transactional id carries one partition's transactions. */
static void tid_of(const km_pipeline *pl, const mpart *p, size_t k, char *buf, size_t len)
{
	snprintf(buf, len, "kmirror/%s/%s/%s/%d/%zu", km_mirror_get_opts(pl->mi)->instance, pl->name, p->t->name,
		 (int)p->id, k);
}

/* Whether tid is one of p's, of any kmirrord instance (another may have run the mirror before). */
static bool tid_is_of(const km_pipeline *pl, const mpart *p, const char *tid)
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

static bool tx_add(km_pipeline *pl, mpart *p, const char *tid)
{
	mtx *n = realloc(p->tx, (p->ntx + 1) * sizeof(*n));
	km_txp *t;
	if (!n)
		return false;
	p->tx = n;
	if (!(t = km_txp_new(pl->dst, tid, p->t->name, p->id, on_cluster_change, pl)))
		return false;
	p->tx[p->ntx++] = (mtx){t, -1, false, -1};
	return true;
}

/* The producer carrying source producer src_pid's open transaction on p; a free one (or a new one) when create. */
static int lease_for(km_pipeline *pl, mpart *p, int64_t src_pid, bool create)
{
	char tid[700];
	for (size_t i = 0; i < p->ntx; i++)
		if (p->tx[i].src_pid == src_pid)
			return (int)i;
	if (!create)
		return -1;
	for (size_t i = 0; i < p->ntx; i++)
		if (p->tx[i].src_pid < 0 && km_txp_state_of(p->tx[i].txp) <= KM_TXP_FREE) {
			p->tx[i].src_pid = src_pid;
			p->tx[i].begun = false;
			p->tx[i].first_logical = -1;
			return (int)i;
		}
	for (size_t k = p->ntx;; k++) {
		bool taken = false;
		tid_of(pl, p, k, tid, sizeof(tid));
		for (size_t i = 0; i < p->ntx; i++)
			taken |= !strcmp(km_txp_id(p->tx[i].txp), tid);
		if (!taken)
			break;
	}
	if (!tx_add(pl, p, tid))
		return -1;
	p->tx[p->ntx - 1].src_pid = src_pid;
	return (int)p->ntx - 1;
}

static bool tx_open(const mpart *p)
{
	for (size_t i = 0; i < p->ntx; i++)
		if (p->tx[i].src_pid >= 0)
			return true;
	return false;
}

/* Describe's figure: where the earliest open destination transaction of p starts (offmap.open_txn_logical). */
static void publish_open(km_pipeline *pl, mpart *p)
{
	km_offmap *m = km_state_offmap_mut(km_mirror_store(pl->mi), p->t->name, p->id);
	int64_t first = -1;
	for (size_t i = 0; i < p->ntx; i++)
		if (p->tx[i].src_pid >= 0 && p->tx[i].first_logical >= 0 &&
		    (first < 0 || p->tx[i].first_logical < first))
			first = p->tx[i].first_logical;
	if (m)
		m->open_txn_logical = first;
}

/* The source transaction p->tx[i] carried is decided (or aborted by a fence): the producer is free. */
static void tx_release(km_pipeline *pl, mpart *p, size_t i)
{
	p->tx[i].src_pid = -1;
	p->tx[i].begun = false;
	p->tx[i].first_logical = -1;
	publish_open(pl, p);
}

static void tx_free_all(mpart *p)
{
	for (size_t i = 0; i < p->ntx; i++)
		km_txp_free(p->tx[i].txp);
	free(p->tx);
	p->tx = NULL;
	p->ntx = 0;
}

/*
 * Fence p's transactional ids: every one of its own and every one an earlier life left (listed by
 * ListTransactions) is initialised again, which aborts what it held open and moves its epoch on.
 * True once all are free again.
 */
static bool fence_done(km_pipeline *pl, mpart *p)
{
	char tag[300];
	if (!p->fence_started) {
		for (size_t i = 0; i < pl->nlisted && !p->tx_fenced; i++) {
			bool have = false;
			if (!tid_is_of(pl, p, pl->listed[i]))
				continue;
			for (size_t k = 0; k < p->ntx; k++)
				have |= !strcmp(km_txp_id(p->tx[k].txp), pl->listed[i]);
			if (!have && !tx_add(pl, p, pl->listed[i]))
				return false;
		}
		for (size_t i = 0; i < p->ntx; i++) {
			km_txp_fence(p->tx[i].txp);
			tx_release(pl, p, i);
		}
		if (p->ntx)
			KM_INFO(COMP, 0, "%s/%s: fencing %zu transactional id(s): what they held open is aborted", pl->name,
				ptag(p, tag, sizeof(tag)), p->ntx);
		p->fence_started = true;
	}
	for (size_t i = 0; i < p->ntx; i++) {
		km_txp_state st = km_txp_state_of(p->tx[i].txp);
		if (st == KM_TXP_FAILED) {
			fail_part(pl, p, km_txp_error(p->tx[i].txp));
			p->fence_started = false;
			return false;
		}
		if (st != KM_TXP_FREE)
			return false;
	}
	p->fence_started = false;
	p->tx_fenced = true;
	return true;
}

/* ---- ListTransactions: the transactional ids earlier lives of the mirror left on the destination ---- */

static void on_list_txns(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	int16_t ver = x->ver;
	km_list_transactions_response r;
	km_arena a;
	km_rd rd;
	char mid[300];
	bool ok = false;

	if (pl->closing || pl->txl != 1 || (uintptr_t)x->extra != pl->txl_gen) {
		free(x);
		return;
	}
	free(x);
	snprintf(mid, sizeof(mid), "/%s/", pl->name);
	if (err == KM_OK) {
		km_arena_init(&a, 0);
		km_rd_init(&rd, body, len);
		if (km_list_transactions_response_decode(&rd, ver, &r, &a) == KM_OK && !r.error_code) {
			ok = true;
			for (int32_t i = 0; i < r.transaction_states.count; i++) {
				km_str id = r.transaction_states.items[i].transactional_id;
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
		km_arena_free(&a);
	} else {
		km_mcluster_drop(pl->dst, c);
	}
	if (!ok) {
		pl->txl = 0; /* asked again, from the start */
		pl->txl_at = now_ms();
	} else if (--pl->txl_pending == 0) {
		pl->txl = 2;
		KM_DEBUG(COMP, 0, "%s: %zu transactional id(s) of the mirror on the destination", pl->name, pl->nlisted);
	}
	tick_soon(pl);
}

static void list_txns(km_pipeline *pl, int64_t now)
{
	int32_t nodes[256];
	size_t n = km_mcluster_node_ids(pl->dst, nodes, 256);
	km_list_transactions_request m;

	if (pl->txl != 0 || now - pl->txl_at < 1000)
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
			"without it (%s)", pl->name, TXL_PATIENCE_MS / 1000, km_mcluster_last_error(pl->dst));
		pl->txl = 2;
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
	pl->txl = 1;
	pl->txl_at = now;
	pl->txl_gen++;
	for (size_t i = 0; i < n; i++)
		if (!km_mcluster_usable(pl->dst, km_mcluster_node(pl->dst, nodes[i]))) {
			/* Connecting: asked again on the next tick (a client that becomes ready ticks). */
			pl->txl = 0;
			pl->txl_at = 0;
			return;
		}
	for (size_t i = 0; i < n; i++) {
		req_ctx *x;
		km_net_client *c = km_mcluster_node(pl->dst, nodes[i]);
		int16_t ver;
		km_wr w;
		if (!km_mcluster_usable(pl->dst, c)) {
			pl->txl = 0;
			return; /* asked again when all are connected; the answers of those asked are dropped */
		}
		if ((ver = pick(c, KM_API_LIST_TRANSACTIONS, LT_LO, LT_HI)) < 0) {
			KM_INFO(COMP, 0, "%s: the destination has no ListTransactions (before Kafka 3.0): source "
				"transactions cannot be carried", pl->name);
			pl->txl = 3;
			return;
		}
		km_list_transactions_request_init(&m);
		km_wr_init(&w);
		km_list_transactions_request_encode(&w, ver, &m);
		if ((x = ctx_new(pl, pl->dst, nodes[i], ver)))
			x->extra = (void *)pl->txl_gen;
		if (send_flat(c, KM_API_LIST_TRANSACTIONS, ver, &w, on_list_txns, x) != KM_OK) {
			km_mcluster_drop(pl->dst, c);
			pl->txl = 0;
			return;
		}
		pl->txl_pending++;
	}
}

/* ---- ListOffsets: the destination's end (reconcile) and the source's start ---- */

typedef enum {
	LO_POSITION, /* reconcile's log end (destination), the start position (source) */
	LO_WATCH,    /* a paused partition's source end, for its lag */
	LO_LSO,      /* reconcile's last stable offset (destination, READ_COMMITTED) */
	LO_MARKER,   /* whether a transaction's marker landed (destination) */
} lo_kind;

typedef struct lo_ctx {
	mtopic *t;
	int32_t part;
	bool dest;
	int64_t ts;
	lo_kind kind;
	int64_t tag; /* LO_MARKER: the physical offset of the marker it asks about */
} lo_ctx;

static bool send_lo(km_pipeline *pl, mpart *p, bool dest, int64_t ts, lo_kind kind);
static void after_reconcile(km_pipeline *pl, mpart *p, int64_t end);
static void after_lso(km_pipeline *pl, mpart *p, int64_t end, int64_t lso);
static void fence_from(km_pipeline *pl, mpart *p, int64_t end, int64_t from);
static bool aborted_probe(km_pipeline *pl, mpart *p);
static void marker_answer(km_pipeline *pl, mpart *p, bool ok, int64_t end, int64_t tag);
static void after_start(km_pipeline *pl, mpart *p, int64_t off, bool jump);

static void on_list_offsets(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	lo_ctx *lc = x->extra;
	int16_t ver = x->ver;
	km_list_offsets_response r;
	km_arena a;
	km_rd rd;
	mpart *p;
	int16_t perr = -1;
	int64_t off = -1;

	free(x);
	if (pl->closing) {
		free(lc);
		return;
	}
	p = part_get(pl, lc->t, lc->part, false);
	if (p && lc->kind == LO_WATCH)
		p->watch_inflight = false;
	if (err == KM_OK) {
		km_arena_init(&a, 0);
		km_rd_init(&rd, body, len);
		if (km_list_offsets_response_decode(&rd, ver, &r, &a) == KM_OK && r.topics.count == 1 &&
		    r.topics.items[0].partitions.count == 1) {
			perr = r.topics.items[0].partitions.items[0].error_code;
			off = r.topics.items[0].partitions.items[0].offset;
		}
		km_arena_free(&a);
	} else {
		km_mcluster_drop(lc->dest ? pl->dst : pl->src, c);
	}
	if (p && lc->kind == LO_MARKER) {
		marker_answer(pl, p, err == KM_OK && perr == 0 && off >= 0, off, lc->tag);
	} else if (p && lc->kind == LO_LSO) {
		if (p->phase == PH_RECON_LSO) {
			if (err != KM_OK || perr != 0 || off < 0) {
				pl->dst_meta_need = true;
				p->phase = PH_RECONCILE;
				backoff(p);
			} else {
				after_lso(pl, p, p->recon_end, off);
			}
		}
	} else if (p && lc->kind == LO_WATCH) {
		if (err == KM_OK && perr == 0 && off >= 0) {
			p->source_end = off;
			km_state_partition_progress(km_mirror_store(pl->mi), p->t->name, p->id, off, -1);
			update_lag(p, now_ms());
		} else {
			pl->src_meta_need = true;
		}
	} else if (p && p->phase == PH_START_WAIT && err == KM_OK && perr == 0 && off < 0 && lc->ts >= 0) {
		/* No record at or after the start timestamp yet: start at the source's end. */
		p->start_latest = true;
		p->phase = PH_START;
	} else if (p && (p->phase == PH_RECON_WAIT || p->phase == PH_START_WAIT)) {
		bool recon = p->phase == PH_RECON_WAIT;
		if (err != KM_OK || perr != 0 || off < 0) {
			char tag[300];
			KM_WARN(COMP, 0, "%s/%s: ListOffsets on the %s failed: %s", pl->name, ptag(p, tag, sizeof(tag)),
				lc->dest ? "destination" : "source",
				err != KM_OK ? km_err_name(err) : km_err_name((km_err)perr));
			p->phase = recon ? PH_RECONCILE : PH_START;
			if (lc->dest)
				pl->dst_meta_need = true;
			else
				pl->src_meta_need = true;
			backoff(p);
		} else if (recon) {
			/* Then the last stable offset: open destination transactions end reconcile's resume point. */
			p->recon_end = off;
			p->phase = PH_RECON_LSO;
			if (!send_lo(pl, p, true, -1, LO_LSO)) {
				p->phase = PH_RECONCILE;
				backoff(p);
			}
		} else {
			after_start(pl, p, off, p->oor);
		}
	}
	free(lc);
	tick_soon(pl);
}

/* Send a request about one partition to cl's broker leader, answered to cb with an lo_ctx (*lc copied). */
static bool send_part(km_pipeline *pl, km_mcluster *cl, int32_t leader, km_net_client *c, int16_t key,
		      int16_t ver, km_wr *w, km_net_response_cb cb, const lo_ctx *lc)
{
	lo_ctx *l = calloc(1, sizeof(*l));
	req_ctx *x = ctx_new(pl, cl, leader, ver);

	if (!l || !x) {
		free(l);
		free(x);
		km_wr_free(w);
		return false;
	}
	*l = *lc;
	x->extra = l;
	if (send_flat(c, key, ver, w, cb, x) != KM_OK) {
		free(l);
		km_mcluster_drop(cl, c);
		return false;
	}
	return true;
}

static bool send_list_offsets(km_pipeline *pl, mpart *p, bool dest, int64_t ts)
{
	return send_lo(pl, p, dest, ts, LO_POSITION);
}

static bool send_lo(km_pipeline *pl, mpart *p, bool dest, int64_t ts, lo_kind kind)
{
	km_mcluster *cl = dest ? pl->dst : pl->src;
	int32_t leader = dest ? p->dst_leader : p->src_leader;
	km_net_client *c = leader >= 0 ? km_mcluster_node(cl, leader) : NULL;
	km_list_offsets_request m;
	km_list_offsets_request_list_offsets_topic t;
	km_list_offsets_request_list_offsets_partition pp;
	km_wr w;
	int16_t ver;

	if (!c) {
		if (dest)
			pl->dst_meta_need = true;
		else
			pl->src_meta_need = true;
		return false;
	}
	if (!km_mcluster_usable(cl, c))
		return false;
	if ((ver = pick(c, KM_API_LIST_OFFSETS, LO_LO, LO_HI)) < 0)
		return false;
	km_list_offsets_request_init(&m);
	km_list_offsets_request_list_offsets_topic_init(&t);
	km_list_offsets_request_list_offsets_partition_init(&pp);
	m.replica_id = -1;
	m.isolation_level = kind == LO_LSO ? 1 : 0;
	if (kind == LO_LSO && ver < 2)
		return false; /* no isolation before v2 (Kafka 0.11): no transactions either */
	pp.partition_index = p->id;
	pp.current_leader_epoch = dest ? -1 : p->src_epoch;
	pp.timestamp = ts;
	t.name = km_str_c(p->t->name);
	t.partitions.items = &pp;
	t.partitions.count = 1;
	m.topics.items = &t;
	m.topics.count = 1;
	km_wr_init(&w);
	km_list_offsets_request_encode(&w, ver, &m);
	return send_part(pl, cl, leader, c, KM_API_LIST_OFFSETS, ver, &w, on_list_offsets,
			 &(lo_ctx){p->t, p->id, dest, ts, kind, kind == LO_MARKER && p->head ? p->head->physical : -1});
}

/* The start position asked of the source: mirror.start.offset. */
static int64_t start_timestamp(const km_pipeline *pl)
{
	if (!strcmp(pl->start_mode, "latest"))
		return -1;
	if (!pl->start_mode[0] || !strcmp(pl->start_mode, "earliest"))
		return -2;
	return strtoll(pl->start_mode, NULL, 10);
}

static void run_then(km_pipeline *pl, mpart *p, const km_state_run *r, size_t n, mphase then);

/*
 * The destination's log ends at physical end: the runs say which logical offset that is (every
 * batch that landed is covered by a run, persisted before it was produced). Runs at or past end
 * were written for batches that never landed: they are removed before anything else is written.
 * After a batch landed where it was not planned (p->hide_logical set), everything from there to
 * end is hidden: the runs from hide_logical on go, and a run at (hide_logical, end) closes the run
 * before it at hide_logical, so the mirror resumes at hide_logical, written after what is hidden.
 */
static void after_reconcile(km_pipeline *pl, mpart *p, int64_t end)
{
	km_state *st = km_mirror_store(pl->mi);
	const km_state_topic *t = km_state_topic_find(st, p->t->name, strlen(p->t->name));
	const km_offmap *m = t ? km_state_topic_offmap(t, p->id) : NULL;
	size_t keep = m ? m->n : 0, nw = 0;
	int64_t hide = p->hide_logical;
	km_state_run *w = NULL;
	char tag[300];

	while (keep > 0 && (m->runs[keep - 1].physical >= end || (hide >= 0 && m->runs[keep - 1].logical >= hide)))
		keep--;
	p->acked_phys = p->plan_phys = end;
	p->recon = false;
	p->probe = true;
	p->backoff_ms = 0;
	if (m && (keep < m->n || hide >= 0)) {
		w = calloc(m->n - keep + 1, sizeof(*w));
		if (!w) {
			p->phase = PH_RECONCILE;
			backoff(p);
			return;
		}
		for (size_t i = keep; i < m->n; i++)
			if (m->runs[i].logical != hide) /* that key is rewritten below */
				w[nw++] = (km_state_run){p->t->name, p->id, m->runs[i].logical, -1, -1};
		if (nw)
			KM_INFO(COMP, 0, "%s/%s: %zu run(s) past the destination's end %lld %s: removed", pl->name,
				ptag(p, tag, sizeof(tag)), nw, (long long)end,
				hide >= 0 ? "or past a misplaced batch" : "never landed");
	}
	if (hide >= 0) {
		/* Resume at hide, physically after everything now hidden. */
		KM_WARN(COMP, 0, "%s/%s: destination offsets from the misplaced batch to %lld hidden; resuming at %lld",
			pl->name, ptag(p, tag, sizeof(tag)), (long long)end, (long long)hide);
		w[nw++] = (km_state_run){p->t->name, p->id, hide, end, hide, 0};
		p->cont_logical = p->fetch_logical = p->acked_logical = hide;
		p->cont_lat = false;
	} else if (keep > 0) {
		const km_offrun *r = &m->runs[keep - 1];
		p->cont_logical = r->logical + (end - r->physical);
		p->cont_lat = (r->flags & KM_OFFRUN_LOG_APPEND_TIME) != 0;
		p->fetch_logical = p->acked_logical = p->cont_logical;
	} else {
		/* Nothing mirrored yet: the start position comes from the source; what the destination holds is hidden. */
		p->cont_logical = -1;
	}
	if (keep > 0 || hide >= 0) {
		KM_INFO(COMP, 0, "%s/%s: resumes at offset %lld (destination offset %lld)", pl->name,
			ptag(p, tag, sizeof(tag)), (long long)p->fetch_logical, (long long)end);
		set_tail(pl, p, true);
	}
	if (nw) {
		run_then(pl, p, w, nw, keep > 0 || hide >= 0 ? PH_READY : PH_START); /* hide_logical stays until it is in */
	} else {
		p->hide_logical = -1;
		p->phase = keep > 0 ? PH_READY : PH_START;
	}
	free(w);
}

/*
 * Reconcile with transactions (docs/mirror.md, "Transactions"): the destination's log ends at
 * end, its last stable offset is lso. Data past the LSO sits in destination transactions nobody
 * will end now (an earlier life's, or this partition's own after an uncertain write): the mirror
 * resumes at the LSO's logical offset, what lies past it hidden. Order matters for a crash at any
 * point: a fence run (hide, end) is persisted first, then the partition's transactional ids are
 * fenced (their transactions aborted, the abort markers written), and a second pass over the
 * then settled log writes the run again at the log's new end.
 */
/*
 * The logical offset of physical offset x as reconcile resumes there: the last run starting at or
 * before x, as far into it as x is (its end, then the next run's start, when it is closed before
 * x). -1 without such a run.
 */
static int64_t resume_logical(const km_offmap *m, int64_t x)
{
	size_t i = m ? m->n : 0;
	int64_t len;
	while (i > 0 && m->runs[i - 1].physical > x)
		i--;
	if (!i)
		return -1;
	len = km_offmap_run_length(m, i - 1);
	if (len >= 0 && x - m->runs[i - 1].physical > len)
		return i < m->n ? m->runs[i].logical : m->runs[i - 1].logical + len;
	return m->runs[i - 1].logical + (x - m->runs[i - 1].physical);
}

/* The partition's map, and its fence run if one is persisted (the runs after it were written before the fence). */
static const km_offmap *map_of(km_pipeline *pl, const mpart *p, const km_offrun **fence)
{
	const km_state_topic *t = km_state_topic_find(km_mirror_store(pl->mi), p->t->name, strlen(p->t->name));
	const km_offmap *m = t ? km_state_topic_offmap(t, p->id) : NULL;
	*fence = NULL;
	for (size_t i = 0; m && i < m->n && !*fence; i++)
		if (m->runs[i].flags & KM_OFFRUN_FENCE)
			*fence = &m->runs[i];
	return m;
}

static void after_lso(km_pipeline *pl, mpart *p, int64_t end, int64_t lso)
{
	const km_offrun *fence;
	const km_offmap *m = map_of(pl, p, &fence);

	/* An earlier life's write that landed between the two answers: the LSO is never past the end. */
	if (lso > end)
		lso = end;
	if (!p->tx_fenced) {
		/* Nothing of an earlier life listed for it and nothing of its own: nothing to fence. */
		bool any = p->ntx > 0;
		for (size_t i = 0; i < pl->nlisted && !any; i++)
			any = tid_is_of(pl, p, pl->listed[i]);
		if (!any)
			p->tx_fenced = true;
	}
	if (!p->tx_fenced || tx_open(p) || (lso < end && !fence)) {
		/*
		 * The hidden range starts at the LSO, or earlier: at a batch that landed where it was not
		 * planned (hide_logical), or at the first batch of a transaction this life holds open
		 * (one the destination aborted on its own, by its timeout, is past the LSO already).
		 */
		int64_t from = lso;
		for (size_t i = 0; m && m->n && i < p->ntx; i++)
			if (p->tx[i].src_pid >= 0 && p->tx[i].first_logical >= 0) {
				int64_t ph = km_offmap_to_physical(m, p->tx[i].first_logical);
				if (ph >= 0 && ph < from)
					from = ph;
			}
		if (p->hide_logical >= 0 && m && m->n) {
			int64_t ph = km_offmap_to_physical(m, p->hide_logical);
			if (ph >= 0 && ph < from)
				from = ph;
		}
		if (from < end && from > 0) {
			/* Where the hidden range starts is settled first (aborted_probe). */
			p->recon_hide = from;
			p->phase = PH_RECON_ABORTED;
			if (!aborted_probe(pl, p)) {
				p->phase = PH_RECONCILE;
				backoff(p);
			}
			return;
		}
		fence_from(pl, p, end, from);
		return;
	}
	if (fence)
		p->hide_logical = p->hide_logical >= 0 && p->hide_logical < fence->logical ? p->hide_logical : fence->logical;
	after_reconcile(pl, p, end);
}

/*
 * The partition's transactions are fenced, and what the destination holds from physical offset
 * from on is hidden. Fencing aborts what is open, and an aborted transaction leaves a marker even
 * on a partition it wrote nothing to yet: the resume point is fixed before, by a fence run.
 */
static void fence_from(km_pipeline *pl, mpart *p, int64_t end, int64_t from)
{
	const km_offrun *fence;
	const km_offmap *m = map_of(pl, p, &fence);
	int64_t hide = resume_logical(m, from);
	char tag[300];

	if (hide < 0) {
		/* Nothing mapped (yet): what the destination holds is hidden by the start anyway. */
		if (p->tx_fenced && !tx_open(p))
			after_reconcile(pl, p, end);
		else
			p->phase = PH_FENCE;
		return;
	}
	if (fence && fence->logical < hide)
		hide = fence->logical;
	/* A misplaced batch's hide point and the first batch of every transaction held open come back too. */
	if (p->hide_logical >= 0 && p->hide_logical < hide)
		hide = p->hide_logical;
	for (size_t i = 0; i < p->ntx; i++)
		if (p->tx[i].src_pid >= 0 && p->tx[i].first_logical >= 0 && p->tx[i].first_logical < hide)
			hide = p->tx[i].first_logical;
	if (from < end)
		KM_INFO(COMP, 0, "%s/%s: destination offsets %lld to %lld are in transactions left open: hidden from "
			"offset %lld on, which is mirrored again", pl->name, ptag(p, tag, sizeof(tag)), (long long)from,
			(long long)end, (long long)hide);
	if (!fence || fence->logical != hide) {
		km_state_run r = {p->t->name, p->id, hide, end, hide, KM_OFFRUN_FENCE};
		run_then(pl, p, &r, 1, PH_FENCE);
	} else {
		p->phase = PH_FENCE;
	}
}

/*
 * A transaction the mirror ended (its marker in place) may have begun before the hide point H and
 * ended after it: hiding its marker would leave its aborted records without the marker that
 * closes them for a read_committed reader. A READ_COMMITTED Fetch at H - 1 (one at H, the LSO,
 * returns nothing) names the aborted transactions overlapping H - 1 and later: those beginning
 * before H, less one whose abort marker is the batch at H - 1 (it ends there), span H. H moves to
 * the earliest one's first offset and is asked again there, until none begins before it.
 */
static void on_aborted(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	lo_ctx *lc = x->extra;
	int16_t ver = x->ver;
	mpart *p;
	km_fetch_response r;
	km_arena a;
	km_rd rd;
	int64_t at = -1;
	bool ok = false;

	free(x);
	p = pl->closing ? NULL : part_get(pl, lc->t, lc->part, false);
	free(lc);
	if (!p || p->phase != PH_RECON_ABORTED)
		return;
	if (err == KM_OK) {
		km_arena_init(&a, 0);
		km_rd_init(&rd, body, len);
		bool one = km_fetch_response_decode(&rd, ver, &r, &a) == KM_OK && r.responses.count == 1 &&
			   r.responses.items[0].partitions.count == 1;
		if (one && r.responses.items[0].partitions.items[0].error_code == 1) {
			/* OFFSET_OUT_OF_RANGE: below the destination's log start, nothing earlier to look at. */
			ok = true;
			at = p->recon_hide;
		} else if (one && !r.responses.items[0].partitions.items[0].error_code) {
			const km_fetch_response_partition_data *pd = &r.responses.items[0].partitions.items[0];
			int64_t ended = -1; /* the producer whose abort marker is the batch at H - 1 */
			km_batch_iter it;
			km_batch b;
			km_batch_iter_init(&it, pd->records.p, pd->records.len > 0 ? (size_t)pd->records.len : 0);
			while (km_batch_next(&it, &b))
				if (b.base_offset <= p->recon_hide - 1 && p->recon_hide - 1 <= b.base_offset + b.last_offset_delta &&
				    b.control)
					ended = b.producer_id;
			ok = true;
			at = p->recon_hide;
			for (int32_t i = 0; i < pd->aborted_transactions.count; i++) {
				const km_fetch_response_aborted_transaction *ab = &pd->aborted_transactions.items[i];
				if (ab->first_offset >= 0 && ab->first_offset < at && ab->producer_id != ended)
					at = ab->first_offset;
			}
		}
		km_arena_free(&a);
	} else {
		km_mcluster_drop(pl->dst, c);
	}
	if (!ok) {
		pl->dst_meta_need = true;
		p->phase = PH_RECONCILE;
		backoff(p);
	} else if (at < p->recon_hide && at > 0) {
		p->recon_hide = at;
		if (!aborted_probe(pl, p)) {
			p->phase = PH_RECONCILE;
			backoff(p);
		}
	} else {
		fence_from(pl, p, p->recon_end, at);
	}
	tick_soon(pl);
}

/*
 * A Fetch of the one batch holding offset of p (physical on the destination, logical at the
 * source), with isolation (1: READ_COMMITTED, its aborted transactions named), answered to cb.
 */
static bool one_fetch(km_pipeline *pl, mpart *p, bool dest, int64_t offset, int8_t isolation, km_net_response_cb cb)
{
	km_mcluster *cl = dest ? pl->dst : pl->src;
	int32_t leader = dest ? p->dst_leader : p->src_leader;
	km_net_client *c = leader >= 0 ? km_mcluster_node(cl, leader) : NULL;
	km_fetch_request m;
	km_fetch_request_fetch_topic ft;
	km_fetch_request_fetch_partition fp;
	km_wr w;
	int16_t ver;

	if (!km_mcluster_usable(cl, c) || (ver = pick(c, KM_API_FETCH, FETCH_LO, FETCH_HI)) < 0)
		return false;
	km_fetch_request_init(&m);
	km_fetch_request_fetch_topic_init(&ft);
	km_fetch_request_fetch_partition_init(&fp);
	m.replica_id = -1;
	m.max_wait_ms = 0;
	m.min_bytes = 0;
	m.max_bytes = 1; /* the first batch comes whole anyway */
	m.isolation_level = isolation;
	m.session_id = 0;
	m.session_epoch = -1;
	fp.partition = p->id;
	fp.current_leader_epoch = dest ? -1 : p->src_epoch;
	fp.fetch_offset = offset;
	fp.log_start_offset = -1;
	fp.last_fetched_epoch = -1;
	fp.partition_max_bytes = 1;
	ft.topic = km_str_c(p->t->name);
	ft.partitions.items = &fp;
	ft.partitions.count = 1;
	m.topics.items = &ft;
	m.topics.count = 1;
	km_wr_init(&w);
	km_fetch_request_encode(&w, ver, &m);
	return send_part(pl, cl, leader, c, KM_API_FETCH, ver, &w, cb,
			 &(lo_ctx){p->t, p->id, dest, -1, LO_POSITION, offset});
}

static bool aborted_probe(km_pipeline *pl, mpart *p)
{
	return one_fetch(pl, p, true, p->recon_hide - 1, 1, on_aborted);
}

static void after_start(km_pipeline *pl, mpart *p, int64_t off, bool jump)
{
	char tag[300];
	if (jump) {
		p->oor = false;
		/* The source's retention passed the mirror: a hole, counted. */
		if (off <= p->fetch_logical) {
			/* Past the source's end: its log was truncated below what was mirrored (unclean election?). */
			KM_WARN(COMP, 0, "%s/%s: offset %lld is past the source's log end; retrying", pl->name,
				ptag(p, tag, sizeof(tag)), (long long)p->fetch_logical);
			backoff(p);
		} else {
			uint64_t n = (uint64_t)(off - p->fetch_logical);
			p->skipped += n;
			km_state_partition_progress(km_mirror_store(pl->mi), p->t->name, p->id, -1, (int64_t)p->skipped);
			KM_WARN(COMP, 0, "%s/%s: the source's log starts at %lld, past the mirror's %lld: %llu record(s) "
				"skipped (a hole)", pl->name, ptag(p, tag, sizeof(tag)), (long long)off,
				(long long)p->fetch_logical, (unsigned long long)n);
			p->fetch_logical = off;
		}
		p->phase = PH_READY;
		return;
	}
	p->fetch_logical = off;
	p->acked_logical = off;
	p->first_logical = off;
	KM_INFO(COMP, 0, "%s/%s: starts at source offset %lld (destination offset %lld)", pl->name,
		ptag(p, tag, sizeof(tag)), (long long)off, (long long)p->acked_phys);
	set_tail(pl, p, true);
	p->phase = PH_READY;
}

/* ---- failback: the source is a kmirrord that mirrored these topics from here ---- */

static void on_peer(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	mtopic *t = x->extra;
	int16_t ver = x->ver;
	km_last_mirrored_offsets_response r;
	km_arena a;
	km_rd rd;

	free(x);
	if (pl->closing || t->peer != PEER_ASKED)
		return;
	if (err != KM_OK) {
		km_mcluster_drop(pl->src, c);
		t->peer = PEER_UNKNOWN; /* asked again */
		tick_soon(pl);
		return;
	}
	km_arena_init(&a, 0);
	km_rd_init(&rd, body, len);
	t->peer = PEER_NONE;
	if (km_last_mirrored_offsets_response_decode(&rd, ver, &r, &a) == KM_OK && !r.error_code &&
	    r.topics.count == 1 && !r.topics.items[0].error_code) {
		t->peer = PEER_KNOWN;
		for (int32_t i = 0; i < r.topics.items[0].partitions.count; i++) {
			const km_last_mirrored_offsets_response_partition_result *pr = &r.topics.items[0].partitions.items[i];
			mpart *p = part_get(pl, t, pr->partition_index, false);
			if (!p)
				continue;
			p->peer_offset = pr->last_mirrored_offset;
			snprintf(p->peer_state, sizeof(p->peer_state), "%.*s", pr->state.len > 0 ? (int)pr->state.len : 0,
				 pr->state.p);
		}
		KM_INFO(COMP, 0, "%s/%s: the source's kmirrord mirrored this topic from here: a failback", pl->name,
			t->name);
	}
	km_arena_free(&a);
	tick_soon(pl);
}

/* The hash of a record's key, value, headers and timestamp; 0 when offset is in none of the batches. */
static uint64_t record_hash(const km_bytes *records, int64_t offset)
{
	km_batch_iter it;
	km_batch b;
	uint64_t h = 0;

	km_batch_iter_init(&it, records->p, records->len > 0 ? (size_t)records->len : 0);
	while (!h && km_batch_next(&it, &b)) {
		km_record_iter ri;
		km_record rec;
		uint8_t *scratch = NULL;
		if (b.control || offset < b.base_offset || offset > b.base_offset + b.last_offset_delta)
			continue;
		if (b.codec != KM_CODEC_NONE && !(scratch = malloc(MAX_BATCH_BYTES)))
			return 0;
		if (km_batch_records(&b, scratch, scratch ? MAX_BATCH_BYTES : 0, &ri) == KM_OK)
			while (km_record_next(&ri, &rec))
				if (rec.offset == offset) {
					h = 1469598103934665603ULL;
					h = km_fnv1a(h, &rec.key.len, sizeof(rec.key.len));
					h = km_fnv1a(h, rec.key.p, rec.key.len > 0 ? (size_t)rec.key.len : 0);
					h = km_fnv1a(h, &rec.value.len, sizeof(rec.value.len));
					h = km_fnv1a(h, rec.value.p, rec.value.len > 0 ? (size_t)rec.value.len : 0);
					h = km_fnv1a(h, rec.headers, rec.headers_size);
					h = km_fnv1a(h, &rec.timestamp, sizeof(rec.timestamp));
					h |= 1; /* never 0 */
					break;
				}
		free(scratch);
	}
	return h;
}

static void on_record_probe(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	lo_ctx *lc = x->extra;
	int16_t ver = x->ver;
	bool dest = lc->dest;
	mpart *p = pl->closing ? NULL : part_get(pl, lc->t, lc->part, false);
	int64_t offset = lc->tag;
	km_fetch_response r;
	km_arena a;
	km_rd rd;
	bool ok = false;

	free(x);
	free(lc);
	if (!p)
		return;
	p->fb_pending--;
	if (p->fb_check != 1) {
		/* The other probe failed: asked again once this one is in. */
		if (!p->fb_pending && p->phase == PH_START_WAIT)
			p->phase = PH_START;
		return;
	}
	if (err == KM_OK) {
		km_arena_init(&a, 0);
		km_rd_init(&rd, body, len);
		if (km_fetch_response_decode(&rd, ver, &r, &a) == KM_OK && r.responses.count == 1 &&
		    r.responses.items[0].partitions.count == 1) {
			const km_fetch_response_partition_data *pd = &r.responses.items[0].partitions.items[0];
			ok = pd->error_code == 0 || pd->error_code == 1; /* out of range: not there (retention) */
			if (!pd->error_code)
				p->fb_hash[dest ? 0 : 1] = record_hash(&pd->records, offset);
		}
		km_arena_free(&a);
	} else {
		km_mcluster_drop(dest ? pl->dst : pl->src, c);
	}
	if (!ok) {
		p->fb_check = 0; /* asked again */
		backoff(p);
	}
	if (!p->fb_pending && p->fb_check == 1) {
		char tag[300];
		/* A record gone on either side (retention, compaction) cannot be compared: the answer is trusted. */
		p->fb_check = p->fb_hash[0] && p->fb_hash[1] ? 2 : -1;
		if (p->fb_check < 0)
			KM_WARN(COMP, 0, "%s/%s: failback: the record before offset %lld is not on both sides to compare: "
				"trusting the source's kmirrord", pl->name, ptag(p, tag, sizeof(tag)), (long long)offset + 1);
	}
	if (!p->fb_pending && p->phase == PH_START_WAIT)
		p->phase = PH_START;
	tick_soon(pl);
}

/* Fetch the batch holding offset (logical at the source, physical here) for record_hash. */
static bool record_probe(km_pipeline *pl, mpart *p, bool dest, int64_t offset)
{
	if (!one_fetch(pl, p, dest, offset, 0, on_record_probe))
		return false;
	p->fb_pending++;
	return true;
}

/* Ask the source whether it is a kmirrord that mirrored t from here (LastMirroredOffsets, any mirror). */
static void ask_peer(km_pipeline *pl, mtopic *t)
{
	km_net_client *c = km_mcluster_any(pl->src);
	km_last_mirrored_offsets_request m;
	km_last_mirrored_offsets_request_topic_data td;
	req_ctx *x;
	km_wr w;
	int16_t ver;

	if (!km_mcluster_usable(pl->src, c))
		return;
	if ((ver = pick(c, KM_API_LAST_MIRRORED_OFFSETS, 0, 0)) < 0) {
		t->peer = PEER_NONE; /* a plain Kafka cluster */
		return;
	}
	km_last_mirrored_offsets_request_init(&m);
	km_last_mirrored_offsets_request_topic_data_init(&td);
	m.mirror_name = km_str_c("");
	td.name = km_str_c(t->name);
	td.partitions.count = -1;
	m.topics.items = &td;
	m.topics.count = 1;
	km_wr_init(&w);
	km_last_mirrored_offsets_request_encode(&w, ver, &m);
	if ((x = ctx_new(pl, pl->src, -1, ver)))
		x->extra = t;
	if (send_flat(c, KM_API_LAST_MIRRORED_OFFSETS, ver, &w, on_peer, x) != KM_OK)
		km_mcluster_drop(pl->src, c);
	else
		t->peer = PEER_ASKED;
}

/*
 * A fresh start from a kmirrord that mirrored the partition from here up to offset M and then
 * stopped (the failover): what this destination holds up to M is what it sent, at the same
 * offsets, so it stays (a run mapping it to itself); what it holds past M (its log end E: the
 * divergent tail, written here after the source's kmirrord last fetched) is hidden, and the
 * mirror fetches from M: only the delta crosses. True when it took the partition's start.
 */
static bool failback_start(km_pipeline *pl, mpart *p)
{
	int64_t end = p->acked_phys, k;
	km_state_run r[2];
	size_t n = 0;
	char tag[300];

	if (p->peer_offset < 0)
		return false;
	if (strcmp(p->peer_state, "STOPPED")) {
		char why[300];
		snprintf(why, sizeof(why), "the source's kmirrord mirrors this partition from here (%s there): stop that "
			 "mirror first (the failover), then start this one", p->peer_state);
		fail_part(pl, p, why);
		return true;
	}
	k = p->peer_offset < end ? p->peer_offset : end;
	if (k > 0 && p->fb_check == 0) {
		/* First: was it mirrored from here? The record before k must be the same on both sides. */
		p->fb_hash[0] = p->fb_hash[1] = 0;
		p->fb_pending = 0;
		p->fb_check = 1;
		p->phase = PH_START_WAIT;
		if (!record_probe(pl, p, true, k - 1) || !record_probe(pl, p, false, k - 1)) {
			p->fb_check = 0;
			p->phase = p->fb_pending ? PH_START_WAIT : PH_START;
			backoff(p);
		}
		return true;
	}
	if (k > 0 && p->fb_check == 1)
		return true; /* its probes are out */
	if (k > 0 && p->fb_hash[0] != p->fb_hash[1] && p->fb_check == 2) {
		char why[600];
		snprintf(why, sizeof(why), "the source's kmirrord holds this topic up to offset %lld, but its record at %lld "
			 "differs from the one here: that topic was not mirrored from this cluster, so no failback; to "
			 "mirror it from scratch here, recreate the topic empty and start again", (long long)p->peer_offset,
			 (long long)(k - 1));
		fail_part(pl, p, why);
		return true;
	}
	if (k > 0)
		r[n++] = (km_state_run){p->t->name, p->id, 0, 0, -1, 0};
	if (end > k)
		r[n++] = (km_state_run){p->t->name, p->id, k, end, k > 0 ? k : -1, 0};
	KM_INFO(COMP, 0, "%s/%s: failback: the source's kmirrord mirrored up to offset %lld; %lld record(s) here past "
		"it are hidden, mirroring from %lld (destination offset %lld)", pl->name, ptag(p, tag, sizeof(tag)),
		(long long)p->peer_offset, (long long)(end - k), (long long)k, (long long)end);
	p->fetch_logical = p->acked_logical = p->first_logical = k;
	p->cont_logical = n ? k : -1;
	p->cont_lat = false;
	set_tail(pl, p, true);
	if (n)
		run_then(pl, p, r, n, PH_READY);
	else
		p->phase = PH_READY;
	return true;
}

/* ---- fetch ---- */

typedef struct fetch_ctx fetch_ctx;

/* Runs the plan of one partition's fetched batches asked for, collected over a response. */
typedef struct runs_acc {
	km_state_run *runs;
	size_t n, cap;
} runs_acc;

/* One Fetch and its answer as it streams in (on_fetch_stream). */
struct fetch_ctx {
	km_pipeline *pl;
	int32_t node;
	mpart **parts; /* the partitions it was sent for (ready then) */
	size_t n;
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
	runs_acc ra;         /* the runs the answer's batches start */
	mpart **later;       /* partitions that wait for them to be persisted */
	size_t nlater;
};

static bool runs_push(runs_acc *ra, const km_state_run *r)
{
	if (ra->n == ra->cap) {
		size_t cap = ra->cap ? ra->cap * 2 : 16;
		km_state_run *nr = realloc(ra->runs, cap * sizeof(*nr));
		if (!nr)
			return false;
		ra->runs = nr;
		ra->cap = cap;
	}
	ra->runs[ra->n++] = *r;
	return true;
}

/* Append a planned batch to p; a new run when it does not continue the open one. */
static bool plan(km_pipeline *pl, mpart *p, mbatch *b, runs_acc *ra)
{
	uint8_t *h = b->hdr;
	if (b->kind != BK_MARKER && (km_be16(h + KM_BATCH_OFF_ATTRIBUTES) & KM_BATCH_ATTR_TRANSACTIONAL)) {
		b->kind = BK_TXN;
		if ((b->txi = lease_for(pl, p, (int64_t)km_be64(h + KM_BATCH_OFF_PRODUCER_ID), true)) < 0)
			return false;
		if (p->tx[b->txi].first_logical < 0) {
			p->tx[b->txi].first_logical = b->logical;
			publish_open(pl, p);
		}
	}
	if (b->logical != p->cont_logical || b->lat != p->cont_lat) {
		/* The first run remembers where mirroring began when a hole separates it from its first record. */
		int64_t prev = p->cont_logical >= 0 ? p->cont_logical
			       : p->first_logical >= 0 && p->first_logical < b->logical ? p->first_logical : -1;
		km_state_run r = {p->t->name, p->id, b->logical, p->plan_phys, prev,
				  b->lat ? KM_OFFRUN_LOG_APPEND_TIME : 0};
		if (!runs_push(ra, &r))
			return false;
		p->cont_lat = b->lat;
	}
	b->physical = p->plan_phys;
	p->plan_phys += b->count;
	p->cont_logical = b->logical + b->count;
	if (b->kind == BK_DATA) {
		/* Re-stamp the copied header: baseOffset 0, the mirror's producer; the CRC is done by the caller. */
		km_batch_set_base_offset(h, 0);
		km_batch_set_producer(h, p->pid, p->epoch, p->seq);
		p->seq = km_batch_seq_add(p->seq, b->count);
	} else if (b->kind == BK_TXN) {
		/* Stamped when it goes (stamp_txn): its producer may still be getting its id. */
		km_batch_set_base_offset(h, 0);
	}
	if (p->tail)
		p->tail->next = b;
	else
		p->head = b;
	p->tail = b;
	return true;
}

/* CRC32C of the re-stamped header continued over the batch's bytes from 61 on, in the response buffer. */
static km_err restamp_ref(mbatch *b, const struct evbuffer_ptr *at)
{
	struct evbuffer_ptr ptr = *at;
	size_t left = b->size - KM_BATCH_HEADER_SIZE;
	uint32_t crc = km_crc32c(0, b->hdr + KM_BATCH_OFF_ATTRIBUTES, KM_BATCH_HEADER_SIZE - KM_BATCH_OFF_ATTRIBUTES);
	int n;

	if (!left) {
		km_put_be32(b->hdr + KM_BATCH_OFF_CRC, crc);
		return KM_OK;
	}
	/* at is the batch's first byte; its records start 61 bytes on (walking only the chains between). */
	if (evbuffer_ptr_set(b->resp->buf, &ptr, KM_BATCH_HEADER_SIZE, EVBUFFER_PTR_ADD) != 0)
		return KM_ERR_DECODE;
	n = evbuffer_peek(b->resp->buf, (ev_ssize_t)left, &ptr, NULL, 0);
	if (n <= 0 || !(b->vec = malloc((size_t)n * sizeof(*b->vec))))
		return n <= 0 ? KM_ERR_DECODE : KM_ERR_NOMEM;
	b->nvec = evbuffer_peek(b->resp->buf, (ev_ssize_t)left, &ptr, b->vec, n);
	for (int i = 0; i < b->nvec && left; i++) {
		if (b->vec[i].iov_len > left)
			b->vec[i].iov_len = left; /* the last one may run on into the next batch */
		if (b->kind != BK_TXN) /* a transaction's batch gets its CRC when it is stamped (stamp_txn) */
			crc = km_crc32c(crc, b->vec[i].iov_base, b->vec[i].iov_len);
		left -= b->vec[i].iov_len;
	}
	if (left)
		return KM_ERR_DECODE;
	km_put_be32(b->hdr + KM_BATCH_OFF_CRC, crc);
	return KM_OK;
}

/*
 * A LogAppendTime batch (parsed whole in pb) goes as CreateTime with the append time as its
 * MaxTimestamp (km_batch_append_time_as_create: its records are read, decompressed when they are,
 * and never changed); b->hdr becomes that header and b starts or continues a LogAppendTime run.
 */
static km_err append_time_header(const km_batch *pb, mbatch *b)
{
	uint8_t *scratch = NULL;
	size_t cap = 0;
	km_err rc;

	if (pb->codec != KM_CODEC_NONE) {
		cap = MAX_BATCH_BYTES;
		if (!(scratch = malloc(cap)))
			return KM_ERR_NOMEM;
	}
	rc = km_batch_append_time_as_create(pb, scratch, cap, b->hdr);
	free(scratch);
	b->lat = rc == KM_OK;
	return rc;
}

/* The same for a batch still in the response buffer: copied out whole to be read. */
static km_err append_time_ref(mresp *resp, const struct evbuffer_ptr *at, mbatch *b)
{
	uint8_t *raw = malloc(b->size);
	km_batch pb;
	km_err rc;

	if (!raw)
		return KM_ERR_NOMEM;
	rc = evbuffer_copyout_from(resp->buf, at, raw, b->size) == (ev_ssize_t)b->size ? km_batch_parse(raw, b->size, &pb)
										    : KM_ERR_DECODE;
	if (rc == KM_OK)
		rc = append_time_header(&pb, b);
	free(raw);
	return rc;
}

/* A compacted batch with offsets missing inside: re-encoded once into contiguous pieces (decompresses). */
static km_err split_batch(km_pipeline *pl, mpart *p, mresp *resp, const struct evbuffer_ptr *at, size_t size,
			  runs_acc *ra)
{
	uint8_t *raw = malloc(size), *scratch = NULL;
	size_t cap = 0, pieces = 0;
	km_batch b, pb;
	km_batch_iter it;
	km_wr out;
	km_err rc;

	if (!raw)
		return KM_ERR_NOMEM;
	if (evbuffer_copyout_from(resp->buf, at, raw, size) != (ev_ssize_t)size) {
		free(raw);
		return KM_ERR_DECODE;
	}
	rc = km_batch_parse(raw, size, &b);
	if (rc == KM_OK && b.codec != KM_CODEC_NONE) {
		cap = MAX_BATCH_BYTES;
		scratch = malloc(cap);
		if (!scratch)
			rc = KM_ERR_NOMEM;
	}
	km_wr_init(&out);
	if (rc == KM_OK)
		rc = km_batch_split_gaps(&b, scratch, cap, &out, &pieces);
	free(scratch);
	free(raw);
	if (rc != KM_OK) {
		km_wr_free(&out);
		return rc;
	}
	km_batch_iter_init(&it, out.buf, out.len);
	while (km_batch_next(&it, &pb)) {
		mbatch *nb = calloc(1, sizeof(*nb));
		if (!nb || !(nb->own = malloc(pb.size))) {
			free(nb);
			km_wr_free(&out);
			return KM_ERR_NOMEM;
		}
		memcpy(nb->own, pb.data, pb.size);
		nb->own_len = pb.size;
		memcpy(nb->hdr, pb.data, KM_BATCH_HEADER_SIZE);
		if (pb.log_append_time && (rc = append_time_header(&pb, nb)) != KM_OK) {
			batch_free(nb);
			km_wr_free(&out);
			return rc;
		}
		nb->logical = pb.base_offset;
		nb->count = pb.last_offset_delta + 1;
		nb->size = pb.size;
		nb->max_ts = pb.max_timestamp;
		if (!plan(pl, p, nb, ra)) {
			batch_free(nb);
			km_wr_free(&out);
			return KM_ERR_NOMEM;
		}
		/* The piece is ours: re-stamp it whole, then the header copy follows it. */
		memcpy(nb->own, nb->hdr, KM_BATCH_HEADER_SIZE);
		km_batch_update_crc(nb->own, nb->own_len);
		memcpy(nb->hdr, nb->own, KM_BATCH_HEADER_SIZE);
	}
	km_wr_free(&out);
	return it.err;
}

/*
 * A control batch. A COMMIT or ABORT of a source transaction whose data the partition carries in
 * a destination transaction is planned as a marker at its logical offset: the partition holds
 * there (the rest of this answer is not taken) until the destination transaction has ended and
 * its marker landed at the physical offset planned (drive_marker). Any other control batch, and
 * a marker of a transaction whose data came before the mirror, is a hole.
 */
static km_err take_marker(km_pipeline *pl, mpart *p, mresp *resp, const struct evbuffer_ptr *at, size_t size,
			  const uint8_t *h, runs_acc *ra)
{
	int64_t base = (int64_t)km_be64(h + KM_BATCH_OFF_BASE_OFFSET);
	int64_t last = base + (int32_t)km_be32(h + KM_BATCH_OFF_LAST_OFFSET_DELTA);
	int txi = lease_for(pl, p, (int64_t)km_be64(h + KM_BATCH_OFF_PRODUCER_ID), false);
	uint8_t small[256];
	km_control ctl = {.type = KM_CONTROL_NONE};
	km_batch pb;
	mbatch *b;

	p->fetch_logical = last + 1;
	if (txi < 0 || size > sizeof(small) || evbuffer_copyout_from(resp->buf, at, small, size) != (ev_ssize_t)size ||
	    km_batch_parse(small, size, &pb) != KM_OK || km_batch_control(&pb, NULL, 0, &ctl) != KM_OK ||
	    (ctl.type != KM_CONTROL_COMMIT && ctl.type != KM_CONTROL_ABORT))
		return KM_OK; /* a hole */
	if (!(b = calloc(1, sizeof(*b))))
		return KM_ERR_NOMEM;
	b->kind = BK_MARKER;
	b->commit = ctl.type == KM_CONTROL_COMMIT;
	b->txi = txi;
	b->logical = last;
	b->count = 1;
	b->lat = p->cont_lat; /* a marker continues the run it is in, whatever its kind */
	if (!plan(pl, p, b, ra)) {
		batch_free(b);
		return KM_ERR_NOMEM;
	}
	p->stop_answer = true;
	return KM_OK;
}

/* One batch of p's fetched data: its 61-byte header in h, the whole batch (size bytes) at at in resp. */
static km_err take_batch(km_pipeline *pl, mpart *p, mresp *resp, const struct evbuffer_ptr *at, size_t size,
			 const uint8_t *h, runs_acc *ra, const char **fail)
{
	int64_t base = (int64_t)km_be64(h + KM_BATCH_OFF_BASE_OFFSET);
	uint16_t attr = km_be16(h + KM_BATCH_OFF_ATTRIBUTES);
	int32_t lod = (int32_t)km_be32(h + KM_BATCH_OFF_LAST_OFFSET_DELTA);
	int32_t count = (int32_t)km_be32(h + KM_BATCH_OFF_RECORDS_COUNT);
	int64_t last = base + lod;
	mbatch *b;
	km_err rc;

	if (h[KM_BATCH_OFF_MAGIC] != 2) {
		*fail = "the source sent a record batch older than magic v2 (a pre-0.11 message format)";
		return KM_ERR_UNSUPPORTED;
	}
	if (lod < 0 || count < 0) {
		*fail = "the source sent a malformed record batch";
		return KM_ERR_DECODE;
	}
	if (last < p->fetch_logical || p->stop_answer)
		return KM_OK; /* the first batch of a fetch may end before the fetch offset; after a marker, the next fetch */
	if (attr & KM_BATCH_ATTR_CONTROL)
		return take_marker(pl, p, resp, at, size, h, ra);
	if ((attr & KM_BATCH_ATTR_TRANSACTIONAL) && pl->txl == 3) {
		*fail = "the source partition holds transactional batches, and the destination cannot carry them "
			"(it has no ListTransactions: Kafka 3.0 and later do)";
		return KM_ERR_UNSUPPORTED;
	}
	if (count == 0) {
		p->fetch_logical = last + 1; /* emptied by the cleaner */
		return KM_OK;
	}
	if (p->cont_logical >= 0 && base < p->cont_logical) {
		*fail = "a source batch overlaps records already mirrored (the source log changed under the mirror)";
		return KM_ERR_INVAL;
	}
	p->fetch_logical = last + 1;
	if (count != lod + 1)
		return split_batch(pl, p, resp, at, size, ra);
	b = calloc(1, sizeof(*b));
	if (!b)
		return KM_ERR_NOMEM;
	memcpy(b->hdr, h, KM_BATCH_HEADER_SIZE);
	b->resp = resp;
	resp->refs++;
	b->size = size;
	b->logical = base;
	b->count = count;
	b->max_ts = (int64_t)km_be64(h + KM_BATCH_OFF_MAX_TIMESTAMP);
	if ((attr & KM_BATCH_ATTR_LOG_APPEND_TIME) && (rc = append_time_ref(resp, at, b)) != KM_OK) {
		*fail = "a LogAppendTime source batch could not be read";
		batch_free(b);
		return rc;
	}
	if (!plan(pl, p, b, ra)) {
		batch_free(b);
		return KM_ERR_NOMEM;
	}
	return restamp_ref(b, at);
}

typedef struct runs_ctx {
	km_pipeline *pl;
	mpart **parts;
	size_t n;
} runs_ctx;

static void on_runs(void *arg, const km_state_result *res)
{
	runs_ctx *rc = arg;
	km_pipeline *pl = rc->pl;

	for (size_t i = 0; i < rc->n; i++) {
		mpart *p = rc->parts[i];
		if (p->phase != PH_RUNS)
			continue;
		if (res->code != KM_OK)
			reconcile(pl, p, "the offset map could not be persisted");
		else
			p->phase = p->head ? PH_WRITING : PH_READY;
	}
	free(rc->parts);
	free(rc);
	if (!pl->closing)
		tick_soon(pl);
}

static void handle_fetch_error(km_pipeline *pl, mpart *p, int16_t code)
{
	char tag[300];
	p->errors++;
	switch (code) {
	case 1: /* OFFSET_OUT_OF_RANGE: behind the source's log start (retention, DeleteRecords), or past its end */
		p->oor = true;
		p->phase = PH_START; /* ListOffsets(earliest); after_start counts the hole */
		p->retry_at = 0;
		break;
	case 3:   /* UNKNOWN_TOPIC_OR_PARTITION */
	case 5:   /* LEADER_NOT_AVAILABLE */
	case 6:   /* NOT_LEADER_OR_FOLLOWER */
	case 74:  /* FENCED_LEADER_EPOCH: our metadata is old */
	case 75:  /* UNKNOWN_LEADER_EPOCH: the broker is behind */
	case 100: /* UNKNOWN_TOPIC_ID */
		pl->src_meta_need = true;
		p->phase = PH_READY;
		backoff(p);
		break;
	default:
		KM_WARN(COMP, 0, "%s/%s: source Fetch error %s", pl->name, ptag(p, tag, sizeof(tag)),
			km_err_name((km_err)code));
		p->phase = PH_READY;
		backoff(p);
		break;
	}
}

static void session_reset(km_pipeline *pl, int32_t node);

/*
 * The session part of a Fetch answer (v7+: ThrottleTimeMs, ErrorCode, SessionId first, in h): a
 * full request's answer opens the session (id 0: the broker keeps none, the next request is full
 * again), an incremental one moves the epoch on. An error (FETCH_SESSION_ID_NOT_FOUND after an
 * eviction or a broker restart, INVALID_FETCH_SESSION_EPOCH) drops the session: false, nothing to
 * take.
 */
static bool take_session(km_pipeline *pl, const fetch_ctx *fc, const uint8_t h[10])
{
	mnode_io *io = node_io(&pl->sio, &pl->nsio, fc->node);
	int16_t code = (int16_t)km_be16(h + 4);
	int32_t id = (int32_t)km_be32(h + 6);

	if (!io)
		return false;
	if (code) {
		KM_INFO(COMP, 0, "%s: source broker %d answered the fetch session %d with %s: a new session follows",
			pl->name, (int)fc->node, (int)io->sess_id, km_err_name((km_err)code));
		session_reset(pl, fc->node);
		return false;
	}
	if (fc->full) {
		io->sess_id = id;
		io->sess_epoch = 1;
		if (id)
			KM_DEBUG(COMP, 0, "%s: fetch session %d with source broker %d", pl->name, (int)id, (int)fc->node);
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

	if (!p || p->phase != PH_FETCHING)
		return; /* failed or moved meanwhile */
	if (fc->ra.n > runs_before) {
		p->phase = PH_RUNS;
		fc->later[fc->nlater++] = p;
		return;
	}
	p->phase = p->head ? PH_WRITING : PH_READY;
	if (!p->head && !p->inflight && p->fetch_logical > p->acked_logical) {
		/* Only holes came (markers, emptied batches): the tail moves past them. */
		p->acked_logical = p->fetch_logical;
		set_tail(pl, p, true);
	}
	if (p->head)
		tick_soon(pl); /* written while the rest of the answer arrives */
}

/* The batch the walk stopped at, now that its bytes are all here. */
static void take_pending(fetch_ctx *fc)
{
	km_pipeline *pl = fc->pl;
	struct evbuffer *buf = fc->resp->buf;
	uint8_t h[KM_BATCH_HEADER_SIZE];
	struct evbuffer_ptr ptr;
	const char *fail = NULL;
	km_err rc;

	fc->pend = false;
	if (fc->cur && fc->cur->phase != PH_FETCHING)
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
	rc = take_batch(pl, fc->cur, fc->resp, &fc->cursor, fc->pend_size, h, &fc->ra, &fail);
	if (rc != KM_OK) {
		fail_part(pl, fc->cur, fail ? fail : km_err_name(rc));
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
			mtopic *t = topic_get(pl, fp->topic, false);
			mpart *p = t ? part_get(pl, t, fp->partition, false) : NULL;
			finish_part(fc, fc->cur, fc->cur_runs);
			fc->cur = NULL;
			if (!p || p->phase != PH_FETCHING || p->fetch_seq != fc->seq || p->taken)
				continue; /* not asked for here, listed twice, or failed meanwhile: dropped */
			/* It stays FETCHING while its batches arrive: nothing else moves it meanwhile. */
			p->taken = true;
			if (fp->error_code) {
				handle_fetch_error(pl, p, fp->error_code);
				continue;
			}
			km_state_partition_progress(km_mirror_store(pl->mi), p->t->name, p->id, fp->high_watermark, -1);
			p->source_end = fp->high_watermark;
			if (fp->log_start_offset >= 0)
				p->src_ls = fp->log_start_offset;
			update_lag(p, now_ms());
			p->backoff_ms = 0;
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
				fail_part(pl, fc->cur, "the source sent a record batch too short for its header");
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
		resp_unref(fc->resp);
	free(fc->ra.runs);
	free(fc->later);
	free(fc->parts);
	free(fc);
}

/* The answer is in (or failed): partitions with new runs persist them, the others it left are ready again. */
static void end_answer(fetch_ctx *fc, bool failed)
{
	km_pipeline *pl = fc->pl;
	mnode_io *io = node_io(&pl->sio, &pl->nsio, fc->node);

	if (io)
		io->fetching = false;
	if (!failed && !fc->dropped && (fc->bad || !fc->ended))
		KM_WARN(COMP, 0, "%s: undecodable Fetch response from source broker %d", pl->name, (int)fc->node);
	/* The batches taken are whole and stay good when the rest of the answer is lost. */
	if (!fc->ended)
		finish_part(fc, fc->cur, fc->cur_runs);
	for (size_t i = 0; i < fc->n; i++) {
		fc->parts[i]->taken = false;
		if (fc->parts[i]->phase == PH_FETCHING && fc->parts[i]->fetch_seq == fc->seq)
			fc->parts[i]->phase = PH_READY; /* nothing for it in this answer */
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
			rc->parts = fc->later;
			rc->n = fc->nlater;
			fc->later = NULL;
			km_state_runs_write(km_mirror_store(pl->mi), pl->name, fc->ra.runs, fc->ra.n, on_runs, rc);
		} else {
			for (size_t i = 0; i < fc->nlater; i++)
				reconcile(pl, fc->later[i], "out of memory");
		}
	}
	fetch_ctx_free(fc);
	tick_soon(pl);
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
		km_mcluster_drop(pl->src, c);
		pl->src_meta_need = true;
		session_reset(pl, fc->node);
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
		free(x);
		end_answer(fc, false);
	}
}

static bool fetchable(const mpart *p, int64_t now)
{
	return p->phase == PH_READY && p->state == KM_MP_MIRRORING && !p->settling && p->retry_at <= now &&
	       p->src_leader >= 0 && p->pid >= 0 && !p->head && !p->inflight;
}

/* In the mirror's pipeline, whether or not it can be fetched now: a session keeps it (docs/mirror.md, "Fetch sessions"). */
static bool session_member(const mpart *p, int32_t node)
{
	return p->state == KM_MP_MIRRORING && !p->settling && p->src_leader == node && p->pid >= 0 && p->fetch_logical >= 0;
}

/* Forget node's fetch session: the next Fetch to it is a full one (a new session). */
static void session_reset(km_pipeline *pl, int32_t node)
{
	mnode_io *io = node_io(&pl->sio, &pl->nsio, node);
	if (io) {
		io->sess_id = 0;
		io->sess_epoch = 0;
	}
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++)
			if (pl->topics[i]->parts[j] && pl->topics[i]->parts[j]->sess_node == node)
				pl->topics[i]->parts[j]->sess_node = -1;
}

/*
 * One Fetch to source broker node. With a fetch session (KIP-227, Fetch v7+) the request names only
 * what changed since the last one: a partition new to the session, or whose fetch offset, size or
 * leader epoch differs from what the broker holds; partitions that left (paused, stopped, moved to
 * another leader) are forgotten. A partition still writing its last batches stays in the session
 * with a size of 0, so the broker keeps it without sending its data again (a batch it sends anyway
 * is dropped: the partition does not take data then). The answer is taken only by the partitions
 * that were ready when it was sent, and each of those was sent, or left, at its fetch offset.
 */
static void send_fetch(km_pipeline *pl, int32_t node, int64_t now)
{
	km_net_client *c = km_mcluster_node(pl->src, node);
	mnode_io *io = node_io(&pl->sio, &pl->nsio, node);
	km_fetch_request m;
	km_fetch_request_fetch_topic *ft = NULL;
	km_fetch_request_fetch_partition *fp = NULL;
	km_fetch_request_forgotten_topic *fg = NULL;
	int32_t *fgp = NULL;
	fetch_ctx *fc = NULL;
	req_ctx *x;
	size_t np = 0, nt = 0, nf = 0, nfp = 0, nready = 0, total = 0;
	bool sessions, full;
	km_net_request rq;
	km_net_piece pc;
	km_wr w;
	int16_t ver;

	if (!io || io->fetching || pl->held->bytes >= pl->held_cap)
		return; /* memory is bounded by the fetch sizes, not by the lag */
	if (!c) {
		pl->src_meta_need = true;
		return;
	}
	if (!km_mcluster_usable(pl->src, c))
		return;
	if ((ver = pick(c, KM_API_FETCH, FETCH_LO, FETCH_HI)) < 0) {
		KM_ERROR(COMP, 0, "%s: source broker %d does not support Fetch v%d-%d", pl->name, (int)node, FETCH_LO,
			 FETCH_HI);
		return;
	}
	sessions = ver >= 7 && pl->sessions;
	full = !sessions || io->sess_id == 0;
	if (full)
		session_reset(pl, node);
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			mpart *p = pl->topics[i]->parts[j];
			if (!p)
				continue;
			if (fetchable(p, now) && p->src_leader == node)
				nready++;
			if (p->src_leader == node || p->sess_node == node)
				total++;
		}
	if (!nready)
		return; /* nothing to read: the session waits as it is */
	fc = calloc(1, sizeof(*fc));
	ft = calloc(pl->ntopics, sizeof(*ft));
	fp = calloc(total, sizeof(*fp));
	fg = calloc(pl->ntopics, sizeof(*fg));
	fgp = calloc(total, sizeof(*fgp));
	if (!fc || !ft || !fp || !fg || !fgp || !(fc->parts = calloc(nready, sizeof(*fc->parts))) ||
	    !(fc->later = calloc(nready, sizeof(*fc->later))))
		goto fail;
	fc->pl = pl;
	km_fetch_request_init(&m);
	m.replica_id = -1;
	m.max_wait_ms = FETCH_MAX_WAIT_MS;
	m.min_bytes = 1;
	m.max_bytes = (int32_t)pl->fetch_max_bytes;
	m.isolation_level = 0;
	/* A full request opens a session (id 0, epoch 0) where sessions are used, else none (epoch -1). */
	m.session_id = full ? 0 : io->sess_id;
	m.session_epoch = !sessions ? -1 : full ? 0 : io->sess_epoch;
	for (size_t i = 0; i < pl->ntopics; i++) {
		mtopic *t = pl->topics[i];
		size_t first = np, ffirst = nfp;
		for (int32_t j = 0; j < t->nparts; j++) {
			mpart *p = t->parts[j];
			bool ready, member;
			int64_t off;
			int32_t max;
			if (!p)
				continue;
			ready = fetchable(p, now) && p->src_leader == node;
			member = sessions && session_member(p, node);
			if (!ready && !member) {
				if (p->sess_node == node) {
					fgp[nfp++] = p->id; /* it left the session */
					p->sess_node = -1;
				}
				continue;
			}
			if (ready) {
				fc->parts[fc->n++] = p;
				p->fetch_seq = pl->fetch_seq + 1;
				p->phase = PH_FETCHING;
				p->stop_answer = false;
			}
			off = ready || p->sess_node != node ? p->fetch_logical : p->sess_offset;
			max = ready ? (int32_t)pl->part_max_bytes : 0;
			if (off < 0)
				off = 0; /* a member not started yet: no data is taken before it is ready */
			if (!full && p->sess_node == node && p->sess_offset == off && p->sess_max == max &&
			    p->sess_lepoch == p->src_epoch)
				continue; /* the broker holds it as it is */
			km_fetch_request_fetch_partition_init(&fp[np]);
			fp[np].partition = p->id;
			fp[np].current_leader_epoch = p->src_epoch;
			fp[np].fetch_offset = off;
			fp[np].log_start_offset = -1;
			fp[np].last_fetched_epoch = -1;
			fp[np].partition_max_bytes = max;
			np++;
			if (sessions) {
				p->sess_node = node;
				p->sess_offset = off;
				p->sess_max = max;
				p->sess_lepoch = p->src_epoch;
			}
		}
		if (np > first) {
			km_fetch_request_fetch_topic_init(&ft[nt]);
			ft[nt].topic = km_str_c(t->name);
			ft[nt].partitions.items = &fp[first];
			ft[nt].partitions.count = (int32_t)(np - first);
			nt++;
		}
		if (nfp > ffirst) {
			km_fetch_request_forgotten_topic_init(&fg[nf]);
			fg[nf].topic = km_str_c(t->name);
			fg[nf].partitions.items = &fgp[ffirst];
			fg[nf].partitions.count = (int32_t)(nfp - ffirst);
			nf++;
		}
	}
	m.topics.items = ft;
	m.topics.count = (int32_t)nt;
	m.forgotten_topics_data.items = fg;
	m.forgotten_topics_data.count = (int32_t)nf;
	fc->node = node;
	fc->seq = ++pl->fetch_seq;
	fc->full = full;
	fc->sessions = sessions;
	km_wr_init(&w);
	km_fetch_request_encode(&w, ver, &m);
	x = ctx_new(pl, pl->src, node, ver);
	if (!km_wr_ok(&w) || !x) {
		free(x);
		km_wr_free(&w);
		goto unfetch;
	}
	x->extra = fc;
	pc = (km_net_piece){.p = w.buf, .len = w.len};
	km_net_request_init(&rq, KM_API_FETCH, ver);
	rq.pieces = &pc;
	rq.npieces = 1;
	rq.delivery = KM_NET_STREAM;
	rq.on_stream = on_fetch_stream;
	rq.arg = x;
	if (km_net_client_request(c, &rq) != KM_OK) {
		free(x);
		km_wr_free(&w);
		km_mcluster_drop(pl->src, c);
		goto unfetch;
	}
	km_wr_free(&w);
	io->fetching = true;
	if (full)
		pl->fetch_full++;
	else
		pl->fetch_incremental++;
	free(ft);
	free(fp);
	free(fg);
	free(fgp);
	return;
unfetch:
	for (size_t i = 0; i < fc->n; i++)
		fc->parts[i]->phase = PH_READY;
	session_reset(pl, node); /* what the broker holds is not known now */
fail:
	if (fc)
		fetch_ctx_free(fc);
	free(ft);
	free(fp);
	free(fg);
	free(fgp);
}

/* ---- produce ---- */

typedef struct produce_ctx {
	int32_t node;
	mpart **parts;
	mbatch **batches;
	size_t n;
} produce_ctx;

/* One run written on its own; the partition waits in PH_RUNS and then goes to phase `then`. */
typedef struct run_then_ctx {
	km_pipeline *pl;
	mtopic *t;
	int32_t part;
	mphase then;
} run_then_ctx;

static void on_run_then(void *arg, const km_state_result *res)
{
	run_then_ctx *x = arg;
	km_pipeline *pl = x->pl;
	mpart *p = pl->closing ? NULL : part_get(pl, x->t, x->part, false);

	if (p && p->phase == PH_RUNS) {
		char tag[300];
		if (res->code != KM_OK) {
			KM_WARN(COMP, 0, "%s/%s: the offset map could not be persisted: %s", pl->name,
				ptag(p, tag, sizeof(tag)), res->message ? res->message : km_err_name(res->code));
			p->phase = PH_RECONCILE;
			backoff(p);
		} else {
			p->phase = x->then;
			p->hide_logical = -1;
		}
		if (p->phase == PH_IDLE && (p->state == KM_MP_STOPPING || p->state == KM_MP_PAUSING)) {
			p->settling = true;
			km_mirror_settle(pl->mi, pl->name, p->t->name, p->id, p->state,
					 p->state == KM_MP_PAUSING ? KM_MP_PAUSED : KM_MP_STOPPED, NULL);
		}
		tick_soon(pl);
	}
	free(x);
}

static void run_then(km_pipeline *pl, mpart *p, const km_state_run *r, size_t n, mphase then)
{
	run_then_ctx *x = calloc(1, sizeof(*x));
	if (!x) {
		p->phase = PH_RECONCILE;
		backoff(p);
		return;
	}
	*x = (run_then_ctx){pl, p->t, p->id, then};
	p->phase = PH_RUNS;
	km_state_runs_write(km_mirror_store(pl->mi), pl->name, r, n, on_run_then, x);
}

/*
 * b, taken off the head, is in the destination's log where it was planned (a batch acknowledged,
 * a marker landed): the tail moves after it, with the holes right after it once they are planned
 * (markers, compaction).
 */
static void landed(km_pipeline *pl, mpart *p, mbatch *b)
{
	p->acked_phys = b->physical + b->count;
	p->acked_logical = b->logical + b->count;
	if (!p->head && p->fetch_logical > p->acked_logical)
		p->acked_logical = p->fetch_logical;
	p->failing_since = 0;
	set_tail(pl, p, true);
	batch_free(b);
	if (!p->head && p->phase == PH_WRITING)
		p->phase = PH_READY;
}

static void produce_done(km_pipeline *pl, mpart *p, mbatch *b, int16_t code, int64_t base, const char *msg)
{
	char tag[300], why[400];

	p->inflight--;
	if (p->recon || p->phase == PH_RECONCILE || p->phase == PH_IDLE) {
		/* Reconcile decides from the log what landed. */
		if (p->head == b)
			p->head = b->next;
		if (p->tail == b)
			p->tail = p->head ? p->tail : NULL;
		batch_free(b);
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
			pl->name, ptag(p, tag, sizeof(tag)), (long long)b->logical, (long long)base,
			(long long)b->physical);
		/* Reconcile hides what is there from this batch's logical start on (after_reconcile). */
		if (p->hide_logical < 0 || b->logical < p->hide_logical)
			p->hide_logical = b->logical;
		reconcile(pl, p, "a batch landed at an unexpected offset");
		if (p->head == b)
			p->head = b->next;
		if (!p->head)
			p->tail = NULL;
		batch_free(b);
		return;
	}
	if (p->head == b)
		p->head = b->next;
	if (!p->head)
		p->tail = NULL;
	if (code == 0) {
		p->records += (uint64_t)b->count;
		p->bytes += b->size;
		p->batches++;
		if (b->max_ts > p->newest_ts)
			p->newest_ts = b->max_ts;
		p->probe = false;
		p->backoff_ms = 0;
		landed(pl, p, b);
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
	batch_free(b);
	if (km_err_retriable((km_err)code) || code == 45 || code == 47 || txn_retry) {
		if (code == 6 || code == 3 || code == 5)
			pl->dst_meta_need = true;
		reconcile(pl, p, why);
	} else {
		fail_part(pl, p, why);
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
	if ((io = node_io(&pl->dio, &pl->ndio, pc->node)))
		io->produce_inflight--;
	km_arena_init(&a, 0);
	if (err == KM_OK) {
		km_rd_init(&rd, body, len);
		decoded = km_produce_response_decode(&rd, ver, &r, &a) == KM_OK;
	} else {
		km_mcluster_drop(pl->dst, c);
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
	tick_soon(pl);
}

/*
 * The next unsent batch of p, or NULL. A probe goes alone: nothing else of p until it is answered.
 * A transaction's batch waits until its destination transaction is open; a marker is not produced
 * (drive_marker ends the transaction once everything before it is in).
 */
static mbatch *next_unsent(mpart *p)
{
	if (p->phase != PH_WRITING || p->recon || (p->probe && p->inflight))
		return NULL;
	for (mbatch *b = p->head; b; b = b->next)
		if (!b->sent) {
			if (b->kind == BK_MARKER ||
			    (b->kind == BK_TXN && km_txp_state_of(p->tx[b->txi].txp) != KM_TXP_OPEN))
				return NULL;
			return b;
		}
	return NULL;
}

/* A transaction's batch stamped with its destination producer (id, epoch, the partition's next sequence). */
static km_err stamp_txn(mbatch *b, const km_txp *t)
{
	size_t left = b->size - KM_BATCH_HEADER_SIZE;
	uint32_t crc;

	km_batch_set_producer(b->hdr, km_txp_pid(t), km_txp_epoch(t), km_txp_seq(t));
	if (b->own) {
		memcpy(b->own, b->hdr, KM_BATCH_HEADER_SIZE);
		km_batch_update_crc(b->own, b->own_len);
		memcpy(b->hdr, b->own, KM_BATCH_HEADER_SIZE);
		return KM_OK;
	}
	crc = km_crc32c(0, b->hdr + KM_BATCH_OFF_ATTRIBUTES, KM_BATCH_HEADER_SIZE - KM_BATCH_OFF_ATTRIBUTES);
	for (int i = 0; i < b->nvec && left; i++) {
		crc = km_crc32c(crc, b->vec[i].iov_base, b->vec[i].iov_len);
		left -= b->vec[i].iov_len;
	}
	if (left)
		return KM_ERR_DECODE;
	km_put_be32(b->hdr + KM_BATCH_OFF_CRC, crc);
	return KM_OK;
}

static void encode_str(km_wr *w, bool flex, const char *s)
{
	km_wr_string(w, flex, km_str_c(s));
}

/* Pieces a request to node may need: two framing pieces and the record pieces of each partition's next batch. */
static size_t piece_cap(km_pipeline *pl, int32_t node, size_t cap)
{
	size_t n = cap * 3;
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			mpart *p = pl->topics[i]->parts[j];
			mbatch *b = p && p->dst_leader == node ? next_unsent(p) : NULL;
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

/*
 * One Produce request to node: one batch per partition (a broker rule), as many partitions led
 * by node as have one ready, up to PRODUCE_REQUEST_BYTES. The batch headers are the re-stamped
 * copies; the record bytes are referenced in the fetched response, never copied here.
 */
static bool send_produce(km_pipeline *pl, int32_t node)
{
	km_net_client *c = km_mcluster_node(pl->dst, node);
	mnode_io *io = node_io(&pl->dio, &pl->ndio, node);
	size_t cap = 0, n = 0, bytes = 0, ngroups = 0, npieces = 0, nenc = 0;
	produce_ctx *pc;
	size_t *gstart = NULL;
	km_net_piece *pieces = NULL;
	km_wr *enc = NULL;
	km_net_request rq;
	req_ctx *x;
	km_txp *txp = NULL;
	int16_t ver;
	bool flex, ok = false;

	if (!io || io->produce_inflight >= KM_MIRROR_PRODUCE_INFLIGHT)
		return false;
	if (!c) {
		pl->dst_meta_need = true;
		return false;
	}
	if (!km_mcluster_usable(pl->dst, c))
		return false;
	if ((ver = pick(c, KM_API_PRODUCE, PRODUCE_LO, PRODUCE_HI)) < 0)
		return false;
	flex = ver >= 9;
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			mpart *p = pl->topics[i]->parts[j];
			if (p && p->dst_leader == node && next_unsent(p))
				cap++;
		}
	if (!cap)
		return false;
	pc = calloc(1, sizeof(*pc));
	if (!pc || !(pc->parts = calloc(cap, sizeof(*pc->parts))) ||
	    !(pc->batches = calloc(cap, sizeof(*pc->batches))) || !(gstart = calloc(cap + 1, sizeof(*gstart))) ||
	    !(pieces = calloc(piece_cap(pl, node, cap) + pl->ntopics * 2 + 2, sizeof(*pieces))) ||
	    !(enc = calloc(cap * 2 + pl->ntopics * 2 + 2, sizeof(*enc))))
		goto out;
	pc->node = node;
	/*
	 * Choose: one batch per partition, grouped by topic, within the byte cap. A transaction's
	 * batch goes alone (its producer is the partition's own: one transactional producer per
	 * request, a broker rule); the first partition ready decides which kind this request is.
	 */
	for (size_t i = 0; i < pl->ntopics && bytes < PRODUCE_REQUEST_BYTES && !txp; i++) {
		mtopic *t = pl->topics[i];
		size_t first = n;
		for (int32_t j = 0; j < t->nparts; j++) {
			mpart *p = t->parts[j];
			mbatch *b = p && p->dst_leader == node ? next_unsent(p) : NULL;
			if (!b || (n && b->kind == BK_TXN))
				continue;
			if (n && bytes + b->size > PRODUCE_REQUEST_BYTES)
				break;
			if (b->kind == BK_TXN) {
				txp = p->tx[b->txi].txp;
				if (stamp_txn(b, txp) != KM_OK) {
					txp = NULL;
					continue;
				}
				if (ver > PRODUCE_TXN_HI)
					ver = PRODUCE_TXN_HI;
				flex = ver >= 9;
				pc->parts[n] = p;
				pc->batches[n] = b;
				bytes += b->size;
				n++;
				break;
			}
			pc->parts[n] = p;
			pc->batches[n] = b;
			bytes += b->size;
			n++;
		}
		if (n > first)
			gstart[ngroups++] = first;
	}
	gstart[ngroups] = n;
	/* Encode: transactional id (null for the idempotent producer), acks=all, timeout, the topics. */
	{
		km_wr *w = frame_piece(enc, &nenc, pieces, &npieces);
		if (txp)
			encode_str(w, flex, km_txp_id(txp));
		else if (flex)
			km_wr_uvarint(w, 0);
		else
			km_wr_i16(w, -1);
		km_wr_i16(w, -1);
		km_wr_i32(w, 30000);
		km_wr_array_len(w, flex, (int32_t)ngroups);
	}
	for (size_t g = 0; g < ngroups; g++) {
		km_wr *w = frame_piece(enc, &nenc, pieces, &npieces);
		encode_str(w, flex, pc->parts[gstart[g]]->t->name);
		km_wr_array_len(w, flex, (int32_t)(gstart[g + 1] - gstart[g]));
		for (size_t k = gstart[g]; k < gstart[g + 1]; k++) {
			mbatch *b = pc->batches[k];
			if (k > gstart[g])
				w = frame_piece(enc, &nenc, pieces, &npieces);
			km_wr_i32(w, pc->parts[k]->id);
			if (flex)
				km_wr_uvarint(w, (uint32_t)b->size + 1);
			else
				km_wr_i32(w, (int32_t)b->size);
			km_wr_raw(w, b->hdr, KM_BATCH_HEADER_SIZE);
			if (b->size > KM_BATCH_HEADER_SIZE) {
				if (b->own) {
					pieces[npieces++] = (km_net_piece){.p = b->own + KM_BATCH_HEADER_SIZE,
									   .len = b->size - KM_BATCH_HEADER_SIZE};
				} else {
					/* The record bytes where they are in the fetched response's chains. */
					for (int v = 0; v < b->nvec; v++) {
						b->resp->refs++;
						pieces[npieces++] = (km_net_piece){.p = b->vec[v].iov_base,
										   .len = b->vec[v].iov_len,
										   .release = resp_unref,
										   .release_arg = b->resp};
					}
				}
			}
			w = frame_piece(enc, &nenc, pieces, &npieces);
			if (flex)
				km_wr_uvarint(w, 0); /* the partition's tags */
		}
		if (flex)
			km_wr_uvarint(w, 0); /* the topic's tags */
	}
	if (flex)
		km_wr_uvarint(&enc[nenc - 1], 0); /* the request's tags */
	/* Point the framing pieces at their encoded bytes, in order. */
	{
		size_t e = 0;
		for (size_t i = 0; i < npieces; i++) {
			if (pieces[i].p || pieces[i].buf)
				continue;
			if (e >= nenc || !km_wr_ok(&enc[e]))
				goto out;
			pieces[i].p = enc[e].buf;
			pieces[i].len = enc[e].len;
			e++;
		}
	}
	x = ctx_new(pl, pl->dst, node, ver);
	if (!x)
		goto out;
	x->extra = pc;
	pc->n = n;
	km_net_request_init(&rq, KM_API_PRODUCE, ver);
	rq.pieces = pieces;
	rq.npieces = npieces;
	rq.delivery = KM_NET_FLAT;
	rq.on_flat = on_produce;
	rq.arg = x;
	if (km_net_client_request(c, &rq) != KM_OK) {
		free(x);
		km_mcluster_drop(pl->dst, c);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		pc->batches[i]->sent = true;
		pc->parts[i]->inflight++;
	}
	if (txp)
		km_txp_advance(txp, pc->batches[0]->count);
	io->produce_inflight++;
	pc = NULL;
	ok = true;
out:
	if (!ok)
		/* The referenced pieces were not taken: give their references back. */
		for (size_t i = 0; pieces && i < npieces; i++)
			if (pieces[i].release)
				pieces[i].release(pieces[i].release_arg);
	for (size_t i = 0; enc && i < nenc; i++)
		km_wr_free(&enc[i]);
	free(enc);
	free(pieces);
	free(gstart);
	if (pc) {
		free(pc->parts);
		free(pc->batches);
		free(pc);
	}
	return ok;
}

/* ---- a transaction's marker: the destination transaction ends, its marker lands where the source's is ---- */

/*
 * p's head is a marker and everything before it is in: end the destination transaction as the
 * source's marker says, then ask the destination's log end until the coordinator's marker is in.
 */
static void drive_marker(km_pipeline *pl, mpart *p, int64_t now, int64_t *next)
{
	mbatch *b = p->head;
	km_txp *t = p->tx[b->txi].txp;
	km_txp_state st = km_txp_state_of(t);

	if (st == KM_TXP_FAILED) {
		reconcile(pl, p, km_txp_error(t));
		return;
	}
	if (b->mk == 0 && st == KM_TXP_OPEN) {
		km_txp_end(t, b->commit);
		b->mk = 1;
	} else if (b->mk == 1 && st == KM_TXP_FREE) {
		if (b->mk_at > now) {
			if (b->mk_at < *next)
				*next = b->mk_at;
		} else if (send_lo(pl, p, true, -1, LO_MARKER)) {
			b->mk = 2;
		}
	}
}

static void marker_answer(km_pipeline *pl, mpart *p, bool ok, int64_t end, int64_t at)
{
	mbatch *b = p->head;
	char tag[300];

	if (!b || b->kind != BK_MARKER || b->mk != 2 || b->physical != at)
		return; /* an answer about an earlier marker (reconciled since) */
	b->mk = 1;
	if (!ok)
		pl->dst_meta_need = true; /* the leader may have moved */
	if (!ok || end == b->physical) {
		/* Not in yet (the coordinator writes it after EndTxn's answer): looked at again shortly. */
		b->mk_at = now_ms() + (ok ? MARKER_POLL_MS : BACKOFF_MIN_MS);
		return;
	}
	if (end != b->physical + 1) {
		char why[200];
		snprintf(why, sizeof(why), "a transaction marker planned at destination offset %lld: the log ends at %lld",
			 (long long)b->physical, (long long)end);
		if (p->hide_logical < 0 || b->logical < p->hide_logical)
			p->hide_logical = b->logical;
		reconcile(pl, p, why);
		return;
	}
	KM_DEBUG(COMP, 0, "%s/%s: %s marker at offset %lld (destination offset %lld)", pl->name,
		 ptag(p, tag, sizeof(tag)), b->commit ? "commit" : "abort", (long long)b->logical, (long long)b->physical);
	tx_release(pl, p, (size_t)b->txi);
	p->head = b->next;
	if (!p->head)
		p->tail = NULL;
	landed(pl, p, b);
	tick_soon(pl);
}

/* The partition's producers: transactions to begin, requests to send. */
static void drive_txps(km_pipeline *pl, mpart *p, int64_t now, int64_t *next)
{
	for (size_t i = 0; i < p->ntx; i++) {
		mtx *x = &p->tx[i];
		int64_t at;
		if (x->src_pid >= 0 && !x->begun && km_txp_state_of(x->txp) == KM_TXP_FREE) {
			km_txp_begin(x->txp);
			x->begun = true;
		}
		if (x->src_pid >= 0 && km_txp_state_of(x->txp) == KM_TXP_FAILED && p->phase == PH_WRITING && !p->inflight)
			reconcile(pl, p, km_txp_error(x->txp));
		at = km_txp_poll(x->txp, now);
		if (at < *next)
			*next = at;
	}
}

/* ---- the destination's log start follows the source's (retention, DeleteRecords) ---- */

typedef struct ls_ctx {
	mtopic *t;
	int32_t part;
	int64_t logical;
} ls_ctx;

static void on_delete_records(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	ls_ctx *lc = x->extra;
	int16_t ver = x->ver, code = -1;
	km_delete_records_response r;
	km_arena a;
	km_rd rd;
	mpart *p;

	free(x);
	if (pl->closing) {
		free(lc);
		return;
	}
	p = part_get(pl, lc->t, lc->part, false);
	if (err == KM_OK) {
		km_arena_init(&a, 0);
		km_rd_init(&rd, body, len);
		if (km_delete_records_response_decode(&rd, ver, &r, &a) == KM_OK && r.topics.count == 1 &&
		    r.topics.items[0].partitions.count == 1)
			code = r.topics.items[0].partitions.items[0].error_code;
		km_arena_free(&a);
	} else {
		km_mcluster_drop(pl->dst, c);
	}
	if (p) {
		char tag[300];
		p->ls_inflight = false;
		if (code == 0) {
			p->dst_ls = lc->logical;
			KM_DEBUG(COMP, 0, "%s/%s: the destination's log start follows the source's to %lld", pl->name,
				 ptag(p, tag, sizeof(tag)), (long long)lc->logical);
		} else if (code == 44 || code == 29 || code == 17) {
			/* POLICY_VIOLATION (a compacted topic), not authorized, internal: the destination keeps its start. */
			p->ls_unsupported = true;
			KM_WARN(COMP, 0, "%s/%s: the destination's log start cannot follow the source's (DeleteRecords: %s)",
				pl->name, ptag(p, tag, sizeof(tag)), km_err_name((km_err)code));
		} else {
			KM_WARN(COMP, 0, "%s/%s: DeleteRecords on the destination to follow the source's log start: %s",
				pl->name, ptag(p, tag, sizeof(tag)),
				err != KM_OK ? km_err_name(err) : code < 0 ? "undecodable answer" : km_err_name((km_err)code));
		}
	}
	free(lc);
}

/*
 * The source's log start moved past what the destination starts with: move the destination's,
 * to the physical offset of the same logical one (or of the tail, when the source's passed it).
 */
static void follow_log_start(km_pipeline *pl, mpart *p)
{
	const km_state_topic *t;
	const km_offmap *m;
	int64_t target, phys;
	km_net_client *c;
	km_delete_records_request rq;
	km_delete_records_request_delete_records_topic dt;
	km_delete_records_request_delete_records_partition dp;
	ls_ctx *lc;
	req_ctx *x;
	km_wr w;
	int16_t ver;
	char tag[300];

	/*
	 * Only over what the destination acknowledged, with nothing of the partition in flight: the
	 * tail then maps exactly (before the first batch lands it is where the fetch starts, which
	 * can be past the batch's first record).
	 */
	if (p->ls_inflight || p->ls_unsupported || p->src_ls < 0 || p->acked_logical < 0 || p->dst_leader < 0 ||
	    p->head || p->inflight || p->acked_phys <= 0)
		return;
	target = p->src_ls < p->acked_logical ? p->src_ls : p->acked_logical;
	if (target <= p->dst_ls)
		return;
	t = km_state_topic_find(km_mirror_store(pl->mi), p->t->name, strlen(p->t->name));
	m = t ? km_state_topic_offmap(t, p->id) : NULL;
	if (!m || !m->n || (phys = km_offmap_to_physical(m, target)) < 0)
		return;
	c = km_mcluster_node(pl->dst, p->dst_leader);
	if (!km_mcluster_usable(pl->dst, c) || (ver = pick(c, KM_API_DELETE_RECORDS, 0, 2)) < 0)
		return;
	km_delete_records_request_init(&rq);
	km_delete_records_request_delete_records_topic_init(&dt);
	km_delete_records_request_delete_records_partition_init(&dp);
	dp.partition_index = p->id;
	dp.offset = phys;
	dt.name = km_str_c(p->t->name);
	dt.partitions.items = &dp;
	dt.partitions.count = 1;
	rq.topics.items = &dt;
	rq.topics.count = 1;
	rq.timeout_ms = 30000;
	km_wr_init(&w);
	km_delete_records_request_encode(&w, ver, &rq);
	lc = calloc(1, sizeof(*lc));
	x = ctx_new(pl, pl->dst, p->dst_leader, ver);
	if (!lc || !x) {
		free(lc);
		free(x);
		km_wr_free(&w);
		return;
	}
	*lc = (ls_ctx){p->t, p->id, target};
	KM_DEBUG(COMP, 0, "%s/%s: the source's log start is %lld: DeleteRecords on the destination to %lld", pl->name,
		 ptag(p, tag, sizeof(tag)), (long long)target, (long long)phys);
	x->extra = lc;
	if (send_flat(c, KM_API_DELETE_RECORDS, ver, &w, on_delete_records, x) != KM_OK) {
		free(lc);
		return;
	}
	p->ls_inflight = true;
}

/* ---- the tick: what can move, moves ---- */

/*
 * A pausing or stopping partition that has not reconciled yet settles at once, unless there may be
 * destination transactions left open on it: its own, an earlier life's (its transactional ids
 * listed, not fenced yet, or the listing not in yet), or a fence cut short by a crash.
 */
static bool reconcile_before_settle(km_pipeline *pl, mpart *p)
{
	const km_offrun *fence;
	bool listed = false;

	if (tx_open(p) || pl->txl < 2)
		return true;
	map_of(pl, p, &fence);
	if (fence)
		return true;
	for (size_t i = 0; i < pl->nlisted && !p->tx_fenced && !listed; i++)
		listed = tid_is_of(pl, p, pl->listed[i]);
	return !p->tx_fenced && (p->ntx > 0 || listed);
}

static void settle_drained(km_pipeline *pl, mpart *p)
{
	km_mp_state to = p->state == KM_MP_PAUSING ? KM_MP_PAUSED : KM_MP_STOPPED;
	/*
	 * A Fetch in flight with nothing of this partition taken yet is not waited for: a source that
	 * went away answers it only at the request timeout (31 s), and a failover must not wait that long.
	 * Its part of the answer, if one comes, is dropped (the partition is no longer FETCHING).
	 */
	if (p->phase == PH_FETCHING && !p->taken)
		p->phase = PH_READY;
	if (p->settling || p->inflight || p->phase == PH_FETCHING || p->phase == PH_RUNS)
		return;
	if (p->head && p->head->kind == BK_MARKER)
		return; /* everything before it is in: the source decided, drive_marker ends the transaction */
	drop_unsent(p);
	if (p->head)
		return;
	if (tx_open(p)) {
		/*
		 * Destination transactions the source has not decided (as far as mirrored): reconcile
		 * aborts them and hides what they hold, so none hangs and the stop's offset is their start.
		 */
		char tag[300];
		KM_INFO(COMP, 0, "%s/%s: %s with transactions open: they are aborted", pl->name, ptag(p, tag, sizeof(tag)),
			to == KM_MP_PAUSED ? "pausing" : "stopping");
		p->recon = true;
		p->phase = PH_RECONCILE;
		p->need_pid = true; /* the batches dropped left a gap in the idempotent sequence */
		pl->pid_want = true;
		p->retry_at = 0;
		return;
	}
	if (to == KM_MP_STOPPED && p->acked_phys >= 0 && p->acked_logical > p->cont_logical && p->cont_logical >= 0) {
		/* The partition ends in a hole: a run at the tail, so writes after the stop continue after it. */
		km_state_run r = {p->t->name, p->id, p->acked_logical, p->acked_phys, p->cont_logical,
				  p->cont_lat ? KM_OFFRUN_LOG_APPEND_TIME : 0};
		p->cont_logical = p->acked_logical;
		run_then(pl, p, &r, 1, PH_IDLE);
		return;
	}
	p->phase = PH_IDLE;
	p->settling = true;
	km_mirror_settle(pl->mi, pl->name, p->t->name, p->id, p->state, to, NULL);
}

static void tick(evutil_socket_t fd, short what, void *arg)
{
	km_pipeline *pl = arg;
	int64_t now = now_ms(), next = now + 1000;
	bool need_src_meta = false, need_dst_meta = false, need_pid = false;

	(void)fd;
	(void)what;
	pl->tick_armed = false;
	if (pl->closing || pl->config_error)
		return;
	reread_options(pl, now);
	if (pl->rate > 0) {
		/* Refill; a burst of one second's worth at most. */
		pl->tokens += (now - pl->tokens_at) * pl->rate / 1000;
		if (pl->tokens > pl->rate)
			pl->tokens = pl->rate;
	} else {
		pl->tokens = 0;
	}
	pl->tokens_at = now;
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			mpart *p = pl->topics[i]->parts[j];
			if (!p)
				continue;
			drive_txps(pl, p, now, &next);
			if (p->head && p->head->kind == BK_MARKER && !p->inflight && p->phase == PH_WRITING && !p->recon)
				drive_marker(pl, p, now, &next);
			if ((p->state == KM_MP_PAUSING || p->state == KM_MP_STOPPING) &&
			    (p->phase < PH_RECONCILE || p->phase > PH_FENCE ||
			     (p->phase == PH_RECONCILE && !p->inflight && !reconcile_before_settle(pl, p)))) {
				settle_drained(pl, p);
				continue;
			}
			if (p->phase == PH_IDLE) {
				/* Paused: the source's end is still read now and then, so the lag shows. */
				if (p->state == KM_MP_PAUSED && !p->watch_inflight && now - p->watch_at >= PAUSED_WATCH_MS &&
				    p->src_leader >= 0 && send_lo(pl, p, false, -1, LO_WATCH)) {
					p->watch_inflight = true;
					p->watch_at = now;
				}
				if (p->state == KM_MP_PAUSED && p->src_leader < 0)
					need_src_meta = true;
				continue;
			}
			if (p->state == KM_MP_MIRRORING && p->phase >= PH_READY)
				follow_log_start(pl, p);
			if (p->state == KM_MP_PREPARING && !p->settling &&
			    (p->phase == PH_READY || (p->phase == PH_START && p->t->src_missing))) {
				/*
				 * Reconciled and positioned: the partition mirrors from here. A source topic that
				 * does not exist (yet) is waited for while MIRRORING.
				 */
				p->settling = true;
				km_mirror_settle(pl->mi, pl->name, p->t->name, p->id, KM_MP_PREPARING, KM_MP_MIRRORING, NULL);
			}
			if (p->src_leader < 0)
				need_src_meta = true;
			if (p->dst_leader < 0)
				need_dst_meta = true;
			if (p->need_pid && !p->inflight)
				need_pid = true;
			if (p->retry_at > now) {
				if (p->retry_at < next)
					next = p->retry_at;
				continue;
			}
			if (p->phase == PH_FENCE) {
				if (fence_done(pl, p)) {
					p->phase = PH_RECONCILE; /* the second pass, over the settled log */
					tick_soon(pl);
				}
			} else if (p->phase == PH_RECONCILE && !p->inflight && !p->need_pid && p->dst_leader >= 0 &&
				   pl->txl >= 2) {
				drop_unsent(p);
				if (!p->head && send_list_offsets(pl, p, true, -1))
					p->phase = PH_RECON_WAIT;
			} else if (p->phase == PH_START && p->src_leader >= 0) {
				/* A fresh start asks first whether the source's kmirrord mirrored the topic from here. */
				bool fresh = !p->oor && !p->start_latest && p->cont_logical < 0;
				if (fresh && p->t->peer == PEER_UNKNOWN)
					ask_peer(pl, p->t);
				if (fresh && p->t->peer == PEER_ASKED)
					continue;
				if (fresh && p->t->peer == PEER_KNOWN && failback_start(pl, p))
					continue;
				if (send_list_offsets(pl, p, false, p->oor ? -2 : p->start_latest ? -1 : start_timestamp(pl)))
					p->phase = PH_START_WAIT;
			}
		}
	if (need_pid)
		pl->pid_want = true;
	if (pl->txl == 0)
		list_txns(pl, now);
	if ((need_src_meta || pl->src_meta_need) && !pl->src_meta_inflight &&
	    now - pl->src_meta_at >= METADATA_MIN_INTERVAL_MS)
		send_metadata(pl, pl->src);
	if ((need_dst_meta || pl->dst_meta_need) && !pl->dst_meta_inflight &&
	    now - pl->dst_meta_at >= METADATA_MIN_INTERVAL_MS)
		send_metadata(pl, pl->dst);
	if (pl->pid_want && !pl->pid_inflight)
		send_pid(pl);
	/* Fetch from every source broker with nothing in flight (and tokens, when throttled). */
	if (pl->rate > 0 && pl->tokens < 0) {
		int64_t wait = -pl->tokens * 1000 / pl->rate + 1;
		if (now + wait < next)
			next = now + wait;
	} else {
		int32_t seen[64];
		size_t ns = 0;
		for (size_t i = 0; i < pl->ntopics; i++)
			for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
				mpart *p = pl->topics[i]->parts[j];
				bool dup = false;
				if (!p || !fetchable(p, now))
					continue;
				for (size_t k = 0; k < ns; k++)
					dup |= seen[k] == p->src_leader;
				if (dup)
					continue;
				if (ns < 64)
					seen[ns++] = p->src_leader;
				send_fetch(pl, p->src_leader, now);
			}
	}
	/* Produce to every destination broker while there is something to send and room. */
	{
		int32_t seen[64];
		size_t ns = 0;
		for (size_t i = 0; i < pl->ntopics; i++)
			for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
				mpart *p = pl->topics[i]->parts[j];
				bool dup = false;
				if (!p || p->dst_leader < 0 || !next_unsent(p))
					continue;
				for (size_t k = 0; k < ns; k++)
					dup |= seen[k] == p->dst_leader;
				if (dup)
					continue;
				if (ns < 64)
					seen[ns++] = p->dst_leader;
				while (send_produce(pl, p->dst_leader))
					;
			}
	}
	/* Periodic metadata refresh (partition moves, leader changes without errors). */
	if (now - pl->src_meta_at > pl->meta_interval)
		pl->src_meta_need = true;
	if (now - pl->dst_meta_at > pl->meta_interval)
		pl->dst_meta_need = true;
	schedule_in(pl, next - now > 0 ? next - now : 1);
}

static void schedule_in(km_pipeline *pl, int64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
	if (pl->closing)
		return;
	if (ms == 0) {
		event_del(pl->tick_ev);
		event_active(pl->tick_ev, 0, 0);
		pl->tick_armed = true;
		return;
	}
	if (pl->tick_armed && ms > 0 && event_pending(pl->tick_ev, EV_TIMEOUT, NULL))
		return; /* an earlier tick runs first and re-arms */
	event_add(pl->tick_ev, &tv);
	pl->tick_armed = true;
}

static void on_cluster_change(void *arg)
{
	tick_soon(arg);
}

/* ---- set-up from the mirror's configuration ---- */

static bool setup_source(km_pipeline *pl, const km_state_mirror *m, const km_mirror_options *mo)
{
	pl->src = km_mirror_source_cluster(pl->mi, m, "fetch", mo->fetch_max_bytes + (4 << 20), &pl->src_tls,
					   on_cluster_change, pl, pl->config_msg, sizeof(pl->config_msg));
	return pl->src != NULL;
}

static bool setup_dest(km_pipeline *pl)
{
	pl->dst = km_mirror_dest_cluster(pl->mi, pl->name, "produce", on_cluster_change, pl);
	return pl->dst != NULL;
}

static void take_options(km_pipeline *pl, const km_mirror_options *mo)
{
	pl->fetch_max_bytes = mo->fetch_max_bytes;
	/* What a mirror holds at most: two responses' worth (one being written, one arriving). */
	pl->held_cap = (size_t)mo->fetch_max_bytes * 2;
	pl->part_max_bytes = mo->fetch_partition_max_bytes;
	pl->sessions = mo->fetch_sessions;
	pl->rate = mo->throttle_bytes_per_sec;
	pl->meta_interval = mo->metadata_refresh_interval_ms;
	snprintf(pl->start_mode, sizeof(pl->start_mode), "%s", mo->start_offset ? mo->start_offset : "earliest");
}

/* The options may change at run time (kmirror alter): read again now and then. */
static void reread_options(km_pipeline *pl, int64_t now)
{
	const km_state_mirror *m;
	km_mirror_options mo;

	if (now - pl->options_at < 1000)
		return;
	pl->options_at = now;
	m = km_state_mirror_find(km_mirror_store(pl->mi), pl->name);
	memset(&mo, 0, sizeof(mo));
	if (m && km_state_mirror_options(m, &mo) == KM_OK)
		take_options(pl, &mo);
	km_opt_free(km_state_mirror_option_table(), &mo);
}

km_pipeline *km_pipeline_new(km_mirror *mi, const char *mirror)
{
	km_pipeline *pl = calloc(1, sizeof(*pl));
	const km_state_mirror *m = km_state_mirror_find(km_mirror_store(mi), mirror);
	km_mirror_options mo;

	if (!pl || !m || !(pl->name = strdup(mirror)))
		goto fail;
	pl->mi = mi;
	pl->pid = -1;
	if (!(pl->held = calloc(1, sizeof(*pl->held))))
		goto fail;
	pl->held->refs = 1;
	pl->tick_ev = event_new(km_mirror_base(mi), -1, 0, tick, pl);
	if (!pl->tick_ev)
		goto fail;
	memset(&mo, 0, sizeof(mo));
	if (km_state_mirror_options(m, &mo) != KM_OK)
		goto fail;
	take_options(pl, &mo);
	if (!setup_source(pl, m, &mo) || !setup_dest(pl)) {
		pl->config_error = true;
		KM_ERROR(COMP, 0, "mirror %s: cannot reach its source: %s", mirror, pl->config_msg);
	}
	km_opt_free(km_state_mirror_option_table(), &mo);
	pl->pid_want = true;
	{
		/* Pipelines live as long as the module (the series point into them). */
		km_metric_family *f = km_mirror_metric_families(mi)->fetches;
		const char *full[] = {pl->name, "full"}, *incr[] = {pl->name, "incremental"};
		if (f && (!km_metric_series_ptr(f, full, &pl->fetch_full) ||
			  !km_metric_series_ptr(f, incr, &pl->fetch_incremental)))
			KM_DEBUG(COMP, 0, "mirror %s: a metric series was not kept (the family is full)", mirror);
	}
	return pl;
fail:
	km_pipeline_free(pl);
	return NULL;
}

void km_pipeline_free(km_pipeline *pl)
{
	if (!pl)
		return;
	pl->closing = true;
	km_mcluster_free(pl->src);
	km_mcluster_free(pl->dst);
	for (size_t i = 0; i < pl->ntopics; i++) {
		mtopic *t = pl->topics[i];
		for (int32_t j = 0; j < t->nparts; j++) {
			mpart *p = t->parts[j];
			if (!p)
				continue;
			while (p->head) {
				mbatch *b = p->head;
				p->head = b->next;
				batch_free(b);
			}
			/* The store is freed first (kmirrord.c): its maps are gone, no tail to clear. */
			tx_free_all(p);
			free(p);
		}
		free(t->parts);
		free(t->name);
		free(t);
	}
	free(pl->topics);
	for (size_t i = 0; i < pl->nlisted; i++)
		free(pl->listed[i]);
	free(pl->listed);
	if (pl->held)
		held_unref(pl->held);
	free(pl->sio);
	free(pl->dio);
	if (pl->src_tls)
		SSL_CTX_free(pl->src_tls);
	if (pl->tick_ev)
		event_free(pl->tick_ev);
	free(pl->name);
	free(pl);
}

const char *km_pipeline_name(const km_pipeline *pl)
{
	return pl->name;
}

size_t km_pipeline_count(const km_pipeline *pl)
{
	size_t n = 0;
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			const mpart *p = pl->topics[i]->parts[j];
			if (p && (p->phase != PH_IDLE || p->settling || p->inflight))
				n++;
		}
	return n;
}

void km_pipeline_partition(km_pipeline *pl, const char *topic, int32_t partition, km_mp_state state)
{
	bool run = state == KM_MP_PREPARING || state == KM_MP_MIRRORING || state == KM_MP_PAUSING ||
		   state == KM_MP_STOPPING;
	mtopic *t = topic_get(pl, topic, run);
	mpart *p = t ? part_get(pl, t, partition, false) : NULL;

	if (!p && run) {
		/*
		 * New here. A restart that finds it pausing or stopping reconciles it before it settles:
		 * an earlier life may have left destination transactions open on it.
		 */
		if (!(p = part_get(pl, t, partition, true)))
			return;
		if (state == KM_MP_PAUSING || state == KM_MP_STOPPING) {
			p->phase = PH_RECONCILE;
			p->recon = true;
			p->need_pid = true;
			pl->pid_want = true;
			pl->dst_meta_need = pl->src_meta_need = true;
		}
	}
	if (!p)
		return;
	p->state = state;
	p->settling = false;
	switch (state) {
	case KM_MP_PREPARING:
	case KM_MP_MIRRORING:
		if (p->phase == PH_IDLE) {
			/* A start, a resume or a restart: reconcile first (a start asks the source's kmirrord again). */
			if (state == KM_MP_PREPARING) {
				p->t->peer = PEER_UNKNOWN;
				p->fb_check = 0;
			}
			p->phase = PH_RECONCILE;
			p->need_pid = true;
			p->retry_at = 0;
			p->backoff_ms = 0;
			pl->pid_want = true;
			pl->dst_meta_need = pl->src_meta_need = true;
		}
		break;
	case KM_MP_PAUSING:
	case KM_MP_STOPPING:
		break; /* the tick drains it */
	default:
		p->phase = PH_IDLE;
		drop_unsent(p);
		/* Paused, the tail stays: it is where the mirror stands and resumes (describe shows it). */
		if (state != KM_MP_PAUSED)
			set_tail(pl, p, false);
		break;
	}
	if (pl->config_error && (state == KM_MP_PREPARING || state == KM_MP_MIRRORING)) {
		fail_part(pl, p, pl->config_msg);
		return;
	}
	tick_soon(pl);
}
