/* The batch plan: where each fetched batch lands, the runs it starts, re-stamped headers, split and marker batches. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/crc32c.h"
#include "mirror/pipeline/plan.h"

void km_plan_held_unref(mheld *h)
{
	if (--h->refs == 0)
		free(h);
}

void km_plan_resp_unref(void *arg)
{
	mresp *r = arg;
	if (--r->refs == 0) {
		r->held->bytes -= r->size;
		km_plan_held_unref(r->held);
		evbuffer_free(r->buf);
		free(r);
	}
}

void km_plan_batch_free(mbatch *b)
{
	if (b->resp)
		km_plan_resp_unref(b->resp);
	free(b->vec);
	free(b->own);
	free(b);
}

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
static bool plan(mplan *q, const mplan_env *env, mbatch *b, runs_acc *ra)
{
	uint8_t *h = b->hdr;
	if (b->kind != BK_MARKER && (km_be16(h + KM_BATCH_OFF_ATTRIBUTES) & KM_BATCH_ATTR_TRANSACTIONAL)) {
		b->kind = BK_TXN;
		if ((b->txi = env->txn(env->arg, (int64_t)km_be64(h + KM_BATCH_OFF_PRODUCER_ID), b->logical, MTX_BATCH)) < 0)
			return false;
	}
	if (b->logical != q->cont_logical || b->lat != q->cont_lat) {
		/* The first run remembers where mirroring began when a hole separates it from its first record. */
		int64_t prev = q->cont_logical >= 0 ? q->cont_logical
			       : q->first_logical >= 0 && q->first_logical < b->logical ? q->first_logical : -1;
		km_state_run r = {q->topic, q->partition, b->logical, q->phys, prev,
				  b->lat ? KM_OFFRUN_LOG_APPEND_TIME : 0};
		if (!runs_push(ra, &r))
			return false;
		q->cont_lat = b->lat;
	}
	b->physical = q->phys;
	q->phys += b->count;
	q->cont_logical = b->logical + b->count;
	if (b->kind == BK_DATA) {
		/* Re-stamp the copied header: baseOffset 0, the mirror's producer; the CRC is done by the caller. */
		km_batch_set_base_offset(h, 0);
		km_batch_set_producer(h, q->pid, q->epoch, q->seq);
		q->seq = km_batch_seq_add(q->seq, b->count);
	} else if (b->kind == BK_TXN) {
		/* Stamped when it goes (km_plan_stamp_txn): its producer may still be getting its id. */
		km_batch_set_base_offset(h, 0);
	}
	if (q->tail)
		q->tail->next = b;
	else
		q->head = b;
	q->tail = b;
	return true;
}

/*
 * The CRC32C of b's re-stamped header (from its attributes on) and its record bytes. A batch taken
 * whole from the source gets the source's CRC patched for the header bytes that changed, without
 * reading its records: as fast for a 1 MiB batch as for a 100-byte one, and a batch the source
 * sent with a CRC its records do not match is still refused by the destination (CORRUPT_MESSAGE),
 * as it would have been at the source, instead of going on under a CRC made here. Other batches
 * (split, re-encoded) are summed over their bytes (b->vec).
 */
static km_err crc_refs(mbatch *b)
{
	const size_t hn = KM_BATCH_HEADER_SIZE - KM_BATCH_OFF_ATTRIBUTES;
	size_t left = b->size - KM_BATCH_HEADER_SIZE;
	uint32_t crc;

	if (b->src_known) {
		crc = km_crc32c_patch(b->src_crc, b->size - KM_BATCH_OFF_ATTRIBUTES, 0, b->src_hdr,
				      b->hdr + KM_BATCH_OFF_ATTRIBUTES, hn);
		km_put_be32(b->hdr + KM_BATCH_OFF_CRC, crc);
		return KM_OK;
	}
	crc = km_crc32c(0, b->hdr + KM_BATCH_OFF_ATTRIBUTES, hn);
	for (int i = 0; i < b->nvec && left; i++) {
		crc = km_crc32c(crc, b->vec[i].iov_base, b->vec[i].iov_len);
		left -= b->vec[i].iov_len;
	}
	if (left)
		return KM_ERR_DECODE;
	km_put_be32(b->hdr + KM_BATCH_OFF_CRC, crc);
	return KM_OK;
}

/*
 * Find b's record bytes (from 61 on) in the response buffer's chains, once, then its CRC over the
 * re-stamped header; a transaction's batch gets its CRC when it is stamped (km_plan_stamp_txn).
 */
static km_err restamp_ref(mbatch *b, const struct evbuffer_ptr *at)
{
	struct evbuffer_ptr ptr = *at;
	size_t left = b->size - KM_BATCH_HEADER_SIZE;
	int n;

	if (left) {
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
			left -= b->vec[i].iov_len;
		}
		if (left)
			return KM_ERR_DECODE;
	}
	return b->kind == BK_TXN ? KM_OK : crc_refs(b);
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
static km_err split_batch(mplan *q, const mplan_env *env, mresp *resp, const struct evbuffer_ptr *at, size_t size,
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
			km_plan_batch_free(nb);
			km_wr_free(&out);
			return rc;
		}
		nb->logical = pb.base_offset;
		nb->count = pb.last_offset_delta + 1;
		nb->size = pb.size;
		nb->max_ts = pb.max_timestamp;
		nb->epoch = pb.partition_leader_epoch;
		if (!plan(q, env, nb, ra)) {
			km_plan_batch_free(nb);
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
 * a destination transaction is planned as a marker at its logical offset: nothing after it is
 * written until the destination transaction has ended and its marker landed at the physical
 * offset planned (drive_marker). What follows it is planned meanwhile, so the next transaction's
 * destination transaction begins while this one ends, up to PLAN_MARKERS_AHEAD markers (the rest
 * of the answer is then not taken). Any other control batch, and a marker of a transaction whose
 * data came before the mirror, is a hole.
 */
static km_err take_marker(mplan *q, const mplan_env *env, mresp *resp, const struct evbuffer_ptr *at, size_t size,
			  const uint8_t *h, runs_acc *ra)
{
	int64_t base = (int64_t)km_be64(h + KM_BATCH_OFF_BASE_OFFSET);
	int64_t last = base + (int32_t)km_be32(h + KM_BATCH_OFF_LAST_OFFSET_DELTA);
	uint8_t small[256];
	km_control ctl = {.type = KM_CONTROL_NONE};
	km_batch pb;
	mbatch *b;
	int txi;

	q->fetch_logical = last + 1;
	if (size > sizeof(small) || evbuffer_copyout_from(resp->buf, at, small, size) != (ev_ssize_t)size ||
	    km_batch_parse(small, size, &pb) != KM_OK || km_batch_control(&pb, NULL, 0, &ctl) != KM_OK ||
	    (ctl.type != KM_CONTROL_COMMIT && ctl.type != KM_CONTROL_ABORT) ||
	    (txi = env->txn(env->arg, (int64_t)km_be64(h + KM_BATCH_OFF_PRODUCER_ID), last, MTX_MARKER)) < 0)
		return KM_OK; /* a hole */
	if (!(b = calloc(1, sizeof(*b))))
		return KM_ERR_NOMEM;
	b->kind = BK_MARKER;
	b->epoch = pb.partition_leader_epoch;
	b->commit = ctl.type == KM_CONTROL_COMMIT;
	b->txi = txi;
	b->logical = last;
	b->count = 1;
	b->lat = q->cont_lat; /* a marker continues the run it is in, whatever its kind */
	if (!plan(q, env, b, ra)) {
		km_plan_batch_free(b);
		return KM_ERR_NOMEM;
	}
	q->stop_answer = km_plan_markers(q) >= PLAN_MARKERS_AHEAD;
	return KM_OK;
}

/* One batch of p's fetched data: its 61-byte header in h, the whole batch (size bytes) at at in resp. */
km_err km_plan_take(mplan *q, const mplan_env *env, mresp *resp, const struct evbuffer_ptr *at, size_t size,
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
	if (last < q->fetch_logical || q->stop_answer)
		return KM_OK; /* the first batch of a fetch may end before the fetch offset; past the markers held, the next fetch */
	q->fetch_epoch = (int32_t)km_be32(h + KM_BATCH_OFF_LEADER_EPOCH); /* the divergence check's, holes too */
	if (attr & KM_BATCH_ATTR_CONTROL)
		return take_marker(q, env, resp, at, size, h, ra);
	if ((attr & KM_BATCH_ATTR_TRANSACTIONAL) && env->no_txn) {
		*fail = "the source partition holds transactional batches, and the destination cannot carry them "
			"(it has no ListTransactions: Kafka 3.0 and later do)";
		return KM_ERR_UNSUPPORTED;
	}
	if (count == 0) {
		q->fetch_logical = last + 1; /* emptied by the cleaner */
		return KM_OK;
	}
	if (q->cont_logical >= 0 && base < q->cont_logical) {
		*fail = "a source batch overlaps records already mirrored (the source log changed under the mirror)";
		return KM_ERR_INVAL;
	}
	q->fetch_logical = last + 1;
	if (count != lod + 1)
		return split_batch(q, env, resp, at, size, ra);
	b = calloc(1, sizeof(*b));
	if (!b)
		return KM_ERR_NOMEM;
	memcpy(b->hdr, h, KM_BATCH_HEADER_SIZE);
	memcpy(b->src_hdr, h + KM_BATCH_OFF_ATTRIBUTES, sizeof(b->src_hdr));
	b->src_crc = km_be32(h + KM_BATCH_OFF_CRC);
	b->src_known = true;
	b->resp = resp;
	resp->refs++;
	b->size = size;
	b->logical = base;
	b->count = count;
	b->max_ts = (int64_t)km_be64(h + KM_BATCH_OFF_MAX_TIMESTAMP);
	b->epoch = (int32_t)km_be32(h + KM_BATCH_OFF_LEADER_EPOCH);
	if ((attr & KM_BATCH_ATTR_LOG_APPEND_TIME) && (rc = append_time_ref(resp, at, b)) != KM_OK) {
		*fail = "a LogAppendTime source batch could not be read";
		km_plan_batch_free(b);
		return rc;
	}
	if (!plan(q, env, b, ra)) {
		km_plan_batch_free(b);
		return KM_ERR_NOMEM;
	}
	return restamp_ref(b, at);
}

/* A transaction's batch stamped with its destination producer (id, epoch, the partition's next sequence). */
km_err km_plan_stamp_txn(mbatch *b, int64_t pid, int16_t epoch, int32_t seq)
{
	km_batch_set_producer(b->hdr, pid, epoch, seq);
	if (b->own) {
		memcpy(b->own, b->hdr, KM_BATCH_HEADER_SIZE);
		km_batch_update_crc(b->own, b->own_len);
		memcpy(b->hdr, b->own, KM_BATCH_HEADER_SIZE);
		return KM_OK;
	}
	return crc_refs(b);
}

void km_plan_drop_unsent(mplan *q)
{
	mbatch **pp = &q->head;
	q->tail = NULL;
	while (*pp) {
		mbatch *b = *pp;
		if (b->sent) {
			q->tail = b;
			pp = &b->next;
			continue;
		}
		*pp = b->next;
		km_plan_batch_free(b);
	}
}
