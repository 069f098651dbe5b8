/* Proxy-internal: offset translation on mirror topics (clients see the source's logical offsets; docs/proxy.md, "Offset translation"). */
#ifndef KMIRROR_PROXY_OFFSETS_H
#define KMIRROR_PROXY_OFFSETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>

#include "kmirror/arena.h"
#include "kmirror/error.h"
#include "kmirror/fetch.h"
#include "kmirror/offmap.h"
#include "kmirror/state.h"
#include "kmirror/wire.h"
#include "proxy/apis.h"

/*
 * The read side the hooks need, so that they depend on no store (the proxy fills it from the state
 * store; unit tests from a table). Two steps: a topic (by name, or by id when id is not NULL), then
 * a partition's map, so that a response costs one topic lookup per topic, not per partition.
 */
typedef struct km_off_lookup {
	/* Whether any topic may have a map at all: false (or NULL) and every hook stays out of the way. */
	bool (*active)(void *arg);
	/* The topic's handle, NULL when it is not a mirror topic. */
	const void *(*topic)(void *arg, km_str name, const km_uuid *id);
	/* The partition's map, NULL when it has none (never mirrored): its offsets pass untouched. */
	const km_offmap *(*map)(void *arg, const void *topic, int32_t partition);
	/*
	 * Bumped whenever the handles may have been freed (the store took a model read back or
	 * followed): a handle or map kept across events is looked up again. NULL: never.
	 */
	uint64_t (*epoch)(void *arg);
	/* The topic's name (log_fetch_topics). */
	const char *(*name)(void *arg, const void *topic);
	void *arg;
	/* log_fetch_topics: comma-separated mirror topics whose Fetch answers are logged; NULL or "": none. */
	const char *trace_topics;
} km_off_lookup;

/* For the rows' hooks (offsets.c, share_offsets.c): the session's lookup; where the body starts after
 * the request header (KM_ERR_DECODE and close_reason set when it is malformed); and the classify
 * that holds any request (whole) while some topic may have a map. */
const km_off_lookup *km_off_lookup_of(km_req *rq);
km_err km_off_body_of(km_req *rq, size_t *off);
km_err km_off_hold_classify(km_req *rq);

/* Pending ListOffsets answers stop reaching set (the proxy frees it; the lookups still end). */
typedef struct km_session_set km_session_set;
void km_off_detach(km_session_set *set);

/* The lookup over the state store (st NULL: no maps). */
void km_off_lookup_from_state(km_state *st, km_off_lookup *out);

static inline bool km_off_active(const km_off_lookup *lk)
{
	return lk && lk->active && lk->topic && lk->map && lk->active(lk->arg);
}

/*
 * Whether a physical batch starting at physical is in a run, and then its logical base offset in
 * *logical. A batch never spans two runs (docs/mirror.md), so its base decides for all its records.
 */
bool km_off_batch_logical(const km_offmap *m, int64_t physical, int64_t *logical);
/* The same, giving the run's index (its flags say how to show the batch), or -1 when hidden. */
ssize_t km_off_batch_run(const km_offmap *m, int64_t physical, int64_t *logical);

/*
 * A batch of a LogAppendTime run (KM_OFFRUN_LOG_APPEND_TIME) as the source had it: the attribute
 * bit set again, the CRC fixed from the header alone (km_crc32c_patch, the records need not be
 * here). hdr holds the batch's first KM_BATCH_OFF_LAST_OFFSET_DELTA bytes at least; its length
 * field gives the CRC's span. False when the bit was set already (nothing to change).
 */
bool km_off_set_append_time(uint8_t *hdr);

/*
 * One request's translation context: what the response needs from the request (the mapped
 * partitions' logical fetch offsets, ListOffsets timestamps), the lookup, and the streamed Fetch
 * response's cursor. Made by km_off_request; the session frees it with km_off_req_free.
 */
typedef struct km_off_entry {
	km_str topic;      /* by name (v0-12 Fetch, every other API); arena copy */
	km_uuid id;        /* Fetch v13+ */
	int32_t partition;
	int64_t value;     /* Fetch: the client's logical fetch offset; ListOffsets: the timestamp asked */
	int64_t sent;      /* Fetch: the physical fetch offset the request carried */
} km_off_entry;

typedef struct km_off_trace km_off_trace;

typedef struct km_off_req {
	int16_t key, version;
	const km_off_lookup *lk;
	km_off_entry *entries;
	size_t n, cap, cursor;
	/*
	 * The entries by (topic, partition), built at the first lookup the cursor misses (a response
	 * in another order than its request: ListOffsets of thousands of partitions grouped by topic),
	 * so that a response is not a scan of every entry per partition. Open addressing, entry index
	 * + 1 (0: empty), nindex a power of two at least twice n; nindexed: n when it was built.
	 */
	uint32_t *index;
	size_t nindex, nindexed;
	km_arena arena;
	/* A response hook this one runs first (read-only merges, Produce's v10+ tail), and its context. */
	km_resp_hook inner;
	void *inner_ctx;
	void (*inner_free)(void *ctx);
	/* The streamed Fetch response: the current topic and partition. */
	uint32_t cur_ti;
	bool cur_ti_set;
	const void *cur_topic;
	const km_offmap *cur;  /* NULL: the current partition passes untouched */
	uint64_t cur_epoch;    /* the lookup's epoch when cur_topic and cur were found */
	int64_t ref;           /* the logical offset hidden batches are put below; -1: not known yet */
	int64_t ref_sent;      /* the physical offset the request carried for the current partition; -1: not known */
	bool seen_visible;     /* a batch of the current partition was in a run */
	bool blanked;          /* the current partition went out with no records: all past the tail */
	bool before_tail;      /* Fetch: the request asks for a mapped partition before its tail */
	bool committed;        /* ListOffsets: isolation read_committed (an answer stays below the LSO) */
	km_off_trace *trace;   /* log_fetch_topics: the current partition's line (fetch_trace.c); NULL: none yet */
} km_off_req;

km_off_req *km_off_req_new(int16_t key, int16_t version, const km_off_lookup *lk);
void km_off_req_free(void *ctx);
/* The entry for topic (name or id) and partition, or NULL. */
const km_off_entry *km_off_req_find(km_off_req *c, km_str name, const km_uuid *id, int32_t partition);

/*
 * A request body (after its header) of key: Fetch and DeleteRecords are translated (logical ->
 * physical) into out when a mapped partition is in them (*rewrote true); ListOffsets keeps its
 * timestamps. *ctx: the context for the response, NULL when the request names no mapped
 * partition (and for Fetch, a full fetch: an incremental one gets a context anyway, since the
 * broker may answer for partitions of its session that this request does not name).
 */
km_err km_off_request(int16_t key, int16_t version, const uint8_t *body, size_t len, const km_off_lookup *lk,
		      km_off_req **ctx, bool *rewrote, km_wr *out) __attribute__((warn_unused_result));

/*
 * A whole response body (after its header) of ListOffsets, OffsetForLeaderEpoch, DeleteRecords,
 * Produce or DescribeProducers, physical -> logical, into out. *changed false: no partition had a
 * map, out is empty and the body goes on as it came.
 */
km_err km_off_response(km_off_req *c, const uint8_t *body, size_t len, bool *changed, km_wr *out)
	__attribute__((warn_unused_result));

/*
 * The streamed Fetch response's hooks (ctx: the km_off_req, NULL for a response with nothing to
 * translate): partition fields and batch base offsets patched in place. A hook that needs a few
 * bytes past the event that have not arrived returns KM_STREAM_AGAIN.
 */
km_err km_off_fetch_partition(const km_stream_ev *e);
/* n bytes at frame offset off of a streamed answer (KM_STREAM_AGAIN: not here yet). */
km_err km_off_peek(const km_fetch_walk *w, struct evbuffer *in, size_t first, size_t off, void *out, size_t n);

/* ---- fetch_trace.c: log_fetch_topics ---- */

/* A batch as the broker sent it. */
typedef struct km_off_trace_rec {
	int64_t physical, pid;
	int16_t attrs, control; /* control: a control batch's km_control_type (KM_CONTROL_UNKNOWN: not read) */
	int32_t count;
} km_off_trace_rec;

/* Before fetch_partition: the previous partition's line out, the aborted transactions as they came. */
void km_off_trace_part_before(km_off_req *c, const km_fetch_walk *w, struct evbuffer *in, size_t first);
/* After it: the partition's line begun when its topic is listed. */
void km_off_trace_part(km_off_req *c, const km_fetch_walk *w, struct evbuffer *in, size_t first);
/* Whether the current partition's batches go on its line. */
bool km_off_trace_active(const km_off_req *c);
km_err km_off_trace_batch_before(const km_fetch_walk *w, struct evbuffer *in, size_t first, km_off_trace_rec *out);
void km_off_trace_batch(km_off_req *c, const km_fetch_walk *w, struct evbuffer *in, size_t first,
			const km_off_trace_rec *tb);
/* The last line out, the trace's memory freed. */
void km_off_trace_free(km_off_req *c);
km_err km_off_fetch_batch(const km_stream_ev *e);

/* The stages (km_off_feature, apis.h): Fetch, ListOffsets, OffsetForLeaderEpoch, DeleteRecords, Produce, DescribeProducers. */

#endif
