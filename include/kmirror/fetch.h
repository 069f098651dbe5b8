/* The one walker over the layout of a Fetch response (every version the codec knows), for bytes that arrive piecemeal. */
#ifndef KMIRROR_FETCH_H
#define KMIRROR_FETCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>

#include "kmirror/wire.h"

/*
 * The walk follows a Fetch response frame (size prefix included: frame offset 0 is its first byte)
 * through counts, fixed fields and length prefixes, and stops where a caller may want to look or
 * patch. It never copies record bytes: a partition's records are skipped by length, or (when the
 * caller asks, per partition) walked batch by batch, stopping at each batch's 12-byte prefix
 * (baseOffset, batchLength) so that baseOffset can be patched in place. The bytes of everything
 * before w->pos are settled once an event has been handled and may be sent on.
 */
typedef enum {
	KM_FW_ERROR = -1,   /* malformed: counts or lengths do not fit the frame */
	KM_FW_NEED_MORE = 0, /* the next step needs bytes that have not arrived */
	KM_FW_PARTITION,    /* a partition's fields up to its records: w->part */
	KM_FW_BATCH,        /* a record batch prefix inside a partition the caller descended into: w->batch */
	KM_FW_END,          /* the top-level tagged fields start at w->pos (v12+) and run to w->end; v4-11: w->pos == w->end */
} km_fw_event;

typedef struct km_fetch_part {
	uint32_t topic_index;       /* position of the topic in the response */
	char topic[256];            /* v4-12: the topic name (NUL-terminated; Kafka's names are <= 249 bytes) */
	km_uuid topic_id;           /* v13+ */
	int32_t partition;
	int16_t error_code;
	size_t high_watermark_off;  /* frame offset of HighWatermark; LastStableOffset follows (v4+), then LogStartOffset (v5+) */
	int64_t high_watermark;
	int64_t last_stable_offset;
	int64_t log_start_offset;   /* -1 before v5 */
	int32_t aborted_count;      /* -1: null */
	size_t aborted_off;         /* frame offset of the first AbortedTransaction (16 bytes each, + tags in v12+) */
	size_t records_off;         /* frame offset of the first record byte */
	size_t records_len;         /* 0 for null or empty records */
} km_fetch_part;

typedef struct km_fetch_batch {
	size_t off;          /* frame offset of baseOffset */
	int64_t base_offset;
	int32_t length;      /* batchLength: bytes after the length field */
	bool partial;        /* the records end before this batch does (a fetch cut at its size limit) */
} km_fetch_batch;

typedef struct km_fetch_walk {
	int16_t version;
	int phase;
	uint32_t topics, ti, parts, pi;
	size_t pos;          /* frame offset of the next byte the walk needs */
	size_t end;          /* frame length, size prefix included */
	size_t records_end;  /* while descending: frame offset where the partition's records end */
	bool descend;        /* set at KM_FW_PARTITION to get KM_FW_BATCH for each batch of that partition */
	km_fetch_part part;
	km_fetch_batch batch;
	/*
	 * Where the last step started in buf, kept while buf, first and buf's length stay the same (a
	 * whole response walked in place): the next step moves on from there instead of walking buf's
	 * chains from the head, so a walk over a response of many chains stays linear.
	 */
	struct {
		struct evbuffer *buf;
		size_t first, len, pos;
		struct evbuffer_ptr ptr;
	} cache;
} km_fetch_walk;

/* Versions the walker knows: the codec's Fetch range. */
bool km_fetch_walk_supported(int16_t version);
/* frame_len: the whole frame, size prefix included (the response header is v1, with tagged fields, from v12). */
void km_fetch_walk_init(km_fetch_walk *w, int16_t version, size_t frame_len);
/*
 * The next event. buf holds the frame's bytes from frame offset first on (earlier bytes were sent
 * on); the walk never needs a byte before w->pos. After KM_FW_END no further call is needed.
 */
km_fw_event km_fetch_walk_next(km_fetch_walk *w, struct evbuffer *buf, size_t first);

/*
 * Overwrite n bytes at offset off of b in place, across chain boundaries (no copy of anything
 * else). False when b holds fewer than off + n bytes.
 */
bool km_evbuf_patch(struct evbuffer *b, size_t off, const void *data, size_t n);

#endif
