/* Record batches (magic v2): walk headers in place, patch them, iterate records, build and split batches. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/batch.h"
#include "kmirror/crc32c.h"

/* The smallest batchLength Kafka accepts before looking at the magic (a v0 message's overhead). */
#define LEGACY_MIN_LENGTH 14
/* Smallest encoded record: length, attributes, timestamp delta, offset delta, key and value
 * lengths, header count, one byte each. Bounds a records count before anything is allocated. */
#define MIN_RECORD_SIZE 7

/* Wrapping arithmetic: timestamps and offsets come from the wire and may be anything. */
static inline int64_t add64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t sub64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }

void km_batch_iter_init(km_batch_iter *it, const void *buf, size_t len)
{
	memset(it, 0, sizeof(*it));
	it->buf = buf;
	it->len = buf ? len : 0;
}

static bool iter_fail(km_batch_iter *it, km_err err, const char *what)
{
	it->err = err;
	it->err_pos = it->pos;
	it->err_what = what;
	return false;
}

bool km_batch_next(km_batch_iter *it, km_batch *b)
{
	if (it->err || it->pos >= it->len)
		return false;
	size_t left = it->len - it->pos;
	const uint8_t *p = it->buf + it->pos;
	if (left < KM_BATCH_LOG_OVERHEAD) {
		it->truncated_bytes = left;
		it->pos = it->len;
		return false;
	}
	int32_t blen = (int32_t)km_be32(p + KM_BATCH_OFF_LENGTH);
	if (blen < LEGACY_MIN_LENGTH)
		return iter_fail(it, KM_ERR_DECODE, "batch length below the minimum");
	size_t size = KM_BATCH_LOG_OVERHEAD + (size_t)blen;
	if (size > left) {
		/* A Fetch response may end inside a batch: not an error, the rest comes next time. */
		it->truncated_bytes = left;
		it->pos = it->len;
		return false;
	}
	int8_t magic = (int8_t)p[KM_BATCH_OFF_MAGIC];
	if (magic == 0 || magic == 1)
		return iter_fail(it, KM_ERR_UNSUPPORTED, "message format v0/v1 (magic 0/1) is not supported");
	if (magic != 2)
		return iter_fail(it, KM_ERR_DECODE, "unknown magic");
	if (size < KM_BATCH_HEADER_SIZE)
		return iter_fail(it, KM_ERR_DECODE, "batch length too small for a v2 header");

	memset(b, 0, sizeof(*b));
	b->offset = it->pos;
	b->data = p;
	b->size = size;
	b->records = p + KM_BATCH_HEADER_SIZE;
	b->records_size = size - KM_BATCH_HEADER_SIZE;
	b->base_offset = (int64_t)km_be64(p + KM_BATCH_OFF_BASE_OFFSET);
	b->batch_length = blen;
	b->partition_leader_epoch = (int32_t)km_be32(p + KM_BATCH_OFF_LEADER_EPOCH);
	b->magic = magic;
	b->crc = km_be32(p + KM_BATCH_OFF_CRC);
	b->attributes = km_be16(p + KM_BATCH_OFF_ATTRIBUTES);
	b->codec = b->attributes & KM_BATCH_ATTR_CODEC_MASK;
	b->log_append_time = b->attributes & KM_BATCH_ATTR_LOG_APPEND_TIME;
	b->transactional = b->attributes & KM_BATCH_ATTR_TRANSACTIONAL;
	b->control = b->attributes & KM_BATCH_ATTR_CONTROL;
	b->delete_horizon = b->attributes & KM_BATCH_ATTR_DELETE_HORIZON;
	b->last_offset_delta = (int32_t)km_be32(p + KM_BATCH_OFF_LAST_OFFSET_DELTA);
	b->base_timestamp = (int64_t)km_be64(p + KM_BATCH_OFF_BASE_TIMESTAMP);
	b->max_timestamp = (int64_t)km_be64(p + KM_BATCH_OFF_MAX_TIMESTAMP);
	b->producer_id = (int64_t)km_be64(p + KM_BATCH_OFF_PRODUCER_ID);
	b->producer_epoch = (int16_t)km_be16(p + KM_BATCH_OFF_PRODUCER_EPOCH);
	b->base_sequence = (int32_t)km_be32(p + KM_BATCH_OFF_BASE_SEQUENCE);
	b->records_count = (int32_t)km_be32(p + KM_BATCH_OFF_RECORDS_COUNT);
	if (b->records_count < 0)
		return iter_fail(it, KM_ERR_DECODE, "negative records count");
	it->pos += size;
	return true;
}

km_err km_batch_parse(const void *buf, size_t len, km_batch *b)
{
	km_batch_iter it;
	km_batch_iter_init(&it, buf, len);
	if (!km_batch_next(&it, b))
		return it.err ? it.err : KM_ERR_DECODE;
	return b->size == len ? KM_OK : KM_ERR_DECODE;
}

bool km_batch_is_contiguous(const km_batch *b)
{
	return !b->control && b->records_count > 0 && (int64_t)b->records_count == (int64_t)b->last_offset_delta + 1;
}

/* ---- CRC and patching ---- */

uint32_t km_batch_compute_crc(const uint8_t *batch, size_t size)
{
	if (size < KM_BATCH_HEADER_SIZE)
		return 0;
	return km_crc32c(0, batch + KM_BATCH_OFF_ATTRIBUTES, size - KM_BATCH_OFF_ATTRIBUTES);
}

km_err km_batch_verify_crc(const uint8_t *batch, size_t size)
{
	if (size < KM_BATCH_HEADER_SIZE)
		return KM_ERR_DECODE;
	return km_batch_compute_crc(batch, size) == km_be32(batch + KM_BATCH_OFF_CRC) ? KM_OK : KM_ERR_CRC;
}

uint32_t km_batch_update_crc(uint8_t *batch, size_t size)
{
	if (size < KM_BATCH_HEADER_SIZE)
		return 0;
	uint32_t crc = km_batch_compute_crc(batch, size);
	km_put_be32(batch + KM_BATCH_OFF_CRC, crc);
	return crc;
}

void km_batch_set_base_offset(uint8_t *batch, int64_t base_offset)
{
	km_put_be64(batch + KM_BATCH_OFF_BASE_OFFSET, (uint64_t)base_offset);
}

void km_batch_set_partition_leader_epoch(uint8_t *batch, int32_t epoch)
{
	km_put_be32(batch + KM_BATCH_OFF_LEADER_EPOCH, (uint32_t)epoch);
}

void km_batch_set_producer(uint8_t *batch, int64_t producer_id, int16_t producer_epoch, int32_t base_sequence)
{
	km_put_be64(batch + KM_BATCH_OFF_PRODUCER_ID, (uint64_t)producer_id);
	km_put_be16(batch + KM_BATCH_OFF_PRODUCER_EPOCH, (uint16_t)producer_epoch);
	km_put_be32(batch + KM_BATCH_OFF_BASE_SEQUENCE, (uint32_t)base_sequence);
}

uint32_t km_batch_restamp(uint8_t *batch, size_t size, int64_t producer_id, int16_t producer_epoch,
			  int32_t base_sequence)
{
	if (size < KM_BATCH_HEADER_SIZE)
		return 0;
	km_batch_set_producer(batch, producer_id, producer_epoch, base_sequence);
	return km_batch_update_crc(batch, size);
}

km_err km_batch_restamp_iov(const struct iovec *v, size_t n, uint8_t hdr[KM_BATCH_HEADER_SIZE], int64_t producer_id,
			    int16_t producer_epoch, int32_t base_sequence, uint32_t *crc)
{
	size_t got = 0, i = 0, skip = 0, size, left;
	uint32_t c;

	/* Gather the header; remember where in which piece it ended. */
	for (; i < n && got < KM_BATCH_HEADER_SIZE; i++) {
		size_t take = v[i].iov_len < KM_BATCH_HEADER_SIZE - got ? v[i].iov_len : KM_BATCH_HEADER_SIZE - got;
		memcpy(hdr + got, v[i].iov_base, take);
		got += take;
		if (take < v[i].iov_len) {
			skip = take;
			break;
		}
	}
	if (got < KM_BATCH_HEADER_SIZE)
		return KM_ERR_DECODE;
	size = KM_BATCH_LOG_OVERHEAD + (size_t)(uint32_t)km_be32(hdr + KM_BATCH_OFF_LENGTH);
	if ((int32_t)km_be32(hdr + KM_BATCH_OFF_LENGTH) < KM_BATCH_HEADER_SIZE - KM_BATCH_LOG_OVERHEAD)
		return KM_ERR_DECODE;
	km_batch_set_base_offset(hdr, 0);
	km_batch_set_producer(hdr, producer_id, producer_epoch, base_sequence);
	c = km_crc32c(0, hdr + KM_BATCH_OFF_ATTRIBUTES, KM_BATCH_HEADER_SIZE - KM_BATCH_OFF_ATTRIBUTES);
	left = size - KM_BATCH_HEADER_SIZE;
	for (; i < n && left; i++, skip = 0) {
		size_t take = v[i].iov_len - skip < left ? v[i].iov_len - skip : left;
		c = km_crc32c(c, (const uint8_t *)v[i].iov_base + skip, take);
		left -= take;
	}
	if (left)
		return KM_ERR_DECODE;
	km_put_be32(hdr + KM_BATCH_OFF_CRC, c);
	*crc = c;
	return KM_OK;
}

/* ---- records ---- */

void km_record_iter_init(km_record_iter *it, const km_batch *b, const uint8_t *records, size_t len)
{
	memset(it, 0, sizeof(*it));
	km_rd_init(&it->rd, records, records ? len : 0);
	it->left = b->records_count;
	it->base_offset = b->base_offset;
	it->base_timestamp = b->base_timestamp;
	it->max_timestamp = b->max_timestamp;
	it->log_append_time = b->log_append_time;
}

km_err km_batch_records(const km_batch *b, uint8_t *scratch, size_t scratch_cap, km_record_iter *it)
{
	if (b->codec == KM_CODEC_NONE || (b->records_count == 0 && b->records_size == 0)) {
		km_record_iter_init(it, b, b->records, b->records_size);
		return KM_OK;
	}
	size_t n;
	km_err err = km_decompress(b->codec, b->records, b->records_size, scratch, scratch_cap, &n);
	if (err) {
		km_record_iter_init(it, b, NULL, 0);
		it->err = err;
		it->err_what = "records do not decompress";
		return err;
	}
	km_record_iter_init(it, b, scratch, n);
	return KM_OK;
}

static bool rec_fail(km_record_iter *it, const km_rd *r, const char *what)
{
	it->err = KM_ERR_DECODE;
	it->err_what = what ? what : r->err_field;
	it->err_pos = r->err ? r->err_pos : r->pos;
	return false;
}

/* Length-prefixed bytes with a varint length: -1 = null (when allowed). */
static bool rd_varbytes(km_rd *r, const char *field, bool nullable, km_bytes *v)
{
	int32_t len;
	if (!km_rd_varint(r, field, &len))
		return false;
	if (len < -1 || (len == -1 && !nullable))
		return km_rd_fail(r, field, "negative length");
	if (len == -1) {
		*v = KM_BYTES_NULL;
		return true;
	}
	v->len = len;
	return km_rd_raw(r, field, (size_t)len, &v->p);
}

bool km_record_next(km_record_iter *it, km_record *rec)
{
	km_rd *r = &it->rd;
	if (it->err)
		return false;
	if (it->left == 0) {
		if (km_rd_left(r))
			return rec_fail(it, r, "bytes left after the last record (records count too small)");
		return false;
	}
	int32_t len;
	km_rd sub;
	if (!km_rd_left(r))
		return rec_fail(it, r, "records end before the records count (records count too large)");
	if (!km_rd_varint(r, "record length", &len))
		return rec_fail(it, r, NULL);
	if (len < 0)
		return rec_fail(it, r, "negative record length");
	if (!km_rd_sub(r, "record", (size_t)len, &sub))
		return rec_fail(it, r, "record length over the end of the records");

	memset(rec, 0, sizeof(*rec));
	int32_t hc;
	if (!km_rd_i8(&sub, "record attributes", &rec->attributes) ||
	    !km_rd_varlong(&sub, "record timestamp delta", &rec->timestamp_delta) ||
	    !km_rd_varint(&sub, "record offset delta", &rec->offset_delta) ||
	    !rd_varbytes(&sub, "record key", true, &rec->key) ||
	    !rd_varbytes(&sub, "record value", true, &rec->value) ||
	    !km_rd_varint(&sub, "record headers count", &hc))
		return rec_fail(it, &sub, NULL);
	if (hc < 0)
		return rec_fail(it, &sub, "negative headers count");
	rec->headers_count = hc;
	rec->headers = sub.buf + sub.pos;
	size_t hstart = sub.pos;
	for (int32_t i = 0; i < hc; i++) {
		km_bytes k, v;
		if (!rd_varbytes(&sub, "header key", false, &k) || !rd_varbytes(&sub, "header value", true, &v))
			return rec_fail(it, &sub, NULL);
	}
	rec->headers_size = sub.pos - hstart;
	if (km_rd_left(&sub))
		return rec_fail(it, &sub, "record length does not match its fields");
	rec->offset = add64(it->base_offset, rec->offset_delta);
	rec->timestamp = it->log_append_time ? it->max_timestamp : add64(it->base_timestamp, rec->timestamp_delta);
	it->left--;
	return true;
}

void km_record_header_iter_init(km_record_header_iter *hi, const km_record *rec)
{
	km_rd_init(&hi->rd, rec->headers, rec->headers ? rec->headers_size : 0);
	hi->left = rec->headers_count;
}

bool km_record_header_next(km_record_header_iter *hi, km_record_header *h)
{
	km_bytes k;
	if (hi->left <= 0)
		return false;
	/* Already validated by km_record_next: these reads fail only on a forged km_record. */
	if (!rd_varbytes(&hi->rd, "header key", false, &k) || !rd_varbytes(&hi->rd, "header value", true, &h->value))
		return false;
	h->key.p = (const char *)k.p;
	h->key.len = k.len;
	hi->left--;
	return true;
}

/* ---- control records ---- */

const char *km_control_type_name(km_control_type t)
{
	switch (t) {
	case KM_CONTROL_NONE: return "NONE";
	case KM_CONTROL_ABORT: return "ABORT";
	case KM_CONTROL_COMMIT: return "COMMIT";
	case KM_CONTROL_LEADER_CHANGE: return "LEADER_CHANGE";
	case KM_CONTROL_SNAPSHOT_HEADER: return "SNAPSHOT_HEADER";
	case KM_CONTROL_SNAPSHOT_FOOTER: return "SNAPSHOT_FOOTER";
	case KM_CONTROL_KRAFT_VERSION: return "KRAFT_VERSION";
	case KM_CONTROL_KRAFT_VOTERS: return "KRAFT_VOTERS";
	default: return "UNKNOWN";
	}
}

km_err km_control_parse(const km_record *rec, km_control *c)
{
	c->type = KM_CONTROL_UNKNOWN;
	c->raw_type = -1;
	c->version = -1;
	c->coordinator_epoch = -1;
	if (rec->key.len < 4)
		return KM_ERR_DECODE;
	c->version = (int16_t)km_be16(rec->key.p);
	if (c->version < 0)
		return KM_ERR_DECODE;
	c->raw_type = (int16_t)km_be16(rec->key.p + 2);
	c->type = c->raw_type >= KM_CONTROL_ABORT && c->raw_type <= KM_CONTROL_KRAFT_VOTERS
			  ? (km_control_type)c->raw_type
			  : KM_CONTROL_UNKNOWN;
	if (c->type == KM_CONTROL_ABORT || c->type == KM_CONTROL_COMMIT) {
		if (rec->value.len < 6 || (int16_t)km_be16(rec->value.p) < 0)
			return KM_ERR_DECODE;
		c->coordinator_epoch = (int32_t)km_be32(rec->value.p + 2);
	}
	return KM_OK;
}

km_err km_batch_control(const km_batch *b, uint8_t *scratch, size_t scratch_cap, km_control *c)
{
	km_record_iter it;
	km_record rec;
	c->type = KM_CONTROL_NONE;
	c->raw_type = -1;
	c->version = -1;
	c->coordinator_epoch = -1;
	if (!b->control)
		return KM_ERR_INVAL;
	if (b->records_count == 0)
		return KM_OK;
	km_err err = km_batch_records(b, scratch, scratch_cap, &it);
	if (err)
		return err;
	if (!km_record_next(&it, &rec))
		return it.err ? it.err : KM_ERR_DECODE;
	return km_control_parse(&rec, c);
}

/* ---- building ---- */

void km_batch_params_init(km_batch_params *p)
{
	memset(p, 0, sizeof(*p));
	p->codec = KM_CODEC_NONE;
	p->partition_leader_epoch = -1;
	p->producer_id = -1;
	p->producer_epoch = -1;
	p->base_sequence = -1;
	p->max_timestamp = -1;
	p->last_offset_delta = -1;
}

static bool bytes_ok(km_bytes b) { return b.len == -1 || (b.len >= 0 && (b.p || b.len == 0)); }

static km_err write_record(km_wr *w, const km_batch_record *r, int64_t base_ts)
{
	int64_t tsd = sub64(r->timestamp, base_ts);
	size_t body = 1 + km_sz_varlong(tsd) + km_sz_varint(r->offset_delta);
	body += km_sz_varint(r->key.len) + (r->key.len > 0 ? (size_t)r->key.len : 0);
	body += km_sz_varint(r->value.len) + (r->value.len > 0 ? (size_t)r->value.len : 0);
	if (r->headers_count > INT32_MAX)
		return KM_ERR_TOO_LARGE;
	body += km_sz_varint((int32_t)r->headers_count);
	for (size_t i = 0; i < r->headers_count; i++) {
		const km_record_header *h = &r->headers[i];
		body += km_sz_varint(h->key.len) + (size_t)h->key.len;
		body += km_sz_varint(h->value.len) + (h->value.len > 0 ? (size_t)h->value.len : 0);
	}
	if (body > INT32_MAX)
		return KM_ERR_TOO_LARGE;
	km_wr_varint(w, (int32_t)body);
	km_wr_i8(w, 0);
	km_wr_varlong(w, tsd);
	km_wr_varint(w, r->offset_delta);
	km_wr_varint(w, r->key.len);
	if (r->key.len > 0)
		km_wr_raw(w, r->key.p, (size_t)r->key.len);
	km_wr_varint(w, r->value.len);
	if (r->value.len > 0)
		km_wr_raw(w, r->value.p, (size_t)r->value.len);
	km_wr_varint(w, (int32_t)r->headers_count);
	for (size_t i = 0; i < r->headers_count; i++) {
		const km_record_header *h = &r->headers[i];
		km_wr_varint(w, h->key.len);
		km_wr_raw(w, h->key.p, (size_t)h->key.len);
		km_wr_varint(w, h->value.len);
		if (h->value.len > 0)
			km_wr_raw(w, h->value.p, (size_t)h->value.len);
	}
	return km_wr_ok(w) ? KM_OK : KM_ERR_NOMEM;
}

km_err km_batch_build(const km_batch_params *p, const km_batch_record *recs, size_t n, km_wr *out)
{
	if (!p || !recs || n == 0 || n > INT32_MAX || p->codec < KM_CODEC_NONE || p->codec > KM_CODEC_MAX ||
	    !km_wr_ok(out))
		return KM_ERR_INVAL;
	int64_t base_ts = recs[0].timestamp, max_ts = recs[0].timestamp;
	for (size_t i = 0; i < n; i++) {
		const km_batch_record *r = &recs[i];
		if (r->offset_delta < 0 || (i && r->offset_delta <= recs[i - 1].offset_delta))
			return KM_ERR_INVAL;
		if (!bytes_ok(r->key) || !bytes_ok(r->value) || (r->headers_count && !r->headers))
			return KM_ERR_INVAL;
		for (size_t k = 0; k < r->headers_count; k++)
			if (r->headers[k].key.len < 0 || (r->headers[k].key.len && !r->headers[k].key.p) ||
			    !bytes_ok(r->headers[k].value))
				return KM_ERR_INVAL;
		if (r->timestamp > max_ts)
			max_ts = r->timestamp;
	}
	int32_t lod = recs[n - 1].offset_delta;
	if (p->last_offset_delta >= 0) {
		if (p->last_offset_delta < lod)
			return KM_ERR_INVAL;
		lod = p->last_offset_delta;
	}
	if (p->log_append_time)
		max_ts = p->max_timestamp;

	uint16_t attrs = (uint16_t)p->codec;
	if (p->log_append_time)
		attrs |= KM_BATCH_ATTR_LOG_APPEND_TIME;
	if (p->transactional)
		attrs |= KM_BATCH_ATTR_TRANSACTIONAL;
	if (p->control)
		attrs |= KM_BATCH_ATTR_CONTROL;

	size_t start = out->len;
	km_wr_i64(out, p->base_offset);
	km_wr_i32(out, 0); /* batchLength, patched below */
	km_wr_i32(out, p->partition_leader_epoch);
	km_wr_i8(out, 2);
	km_wr_u32(out, 0); /* CRC, computed below */
	km_wr_u16(out, attrs);
	km_wr_i32(out, lod);
	km_wr_i64(out, base_ts);
	km_wr_i64(out, max_ts);
	km_wr_i64(out, p->producer_id);
	km_wr_i16(out, p->producer_epoch);
	km_wr_i32(out, p->base_sequence);
	km_wr_i32(out, (int32_t)n);

	km_err err = KM_OK;
	if (p->codec == KM_CODEC_NONE) {
		for (size_t i = 0; i < n && !err; i++)
			err = write_record(out, &recs[i], base_ts);
	} else {
		km_wr tmp;
		km_wr_init(&tmp);
		for (size_t i = 0; i < n && !err; i++)
			err = write_record(&tmp, &recs[i], base_ts);
		if (!err)
			err = km_compress(p->codec, p->level, tmp.buf, tmp.len, out);
		km_wr_free(&tmp);
	}
	if (!err && !km_wr_ok(out))
		err = KM_ERR_NOMEM;
	if (!err && out->len - start - KM_BATCH_LOG_OVERHEAD > INT32_MAX)
		err = KM_ERR_TOO_LARGE;
	if (err) {
		if (out->len > start && km_wr_ok(out))
			out->len = start;
		return err;
	}
	km_wr_patch_i32(out, start + KM_BATCH_OFF_LENGTH, (int32_t)(out->len - start - KM_BATCH_LOG_OVERHEAD));
	km_batch_update_crc(out->buf + start, out->len - start);
	return KM_OK;
}

km_err km_batch_split_gaps(const km_batch *b, uint8_t *scratch, size_t scratch_cap, km_wr *out, size_t *pieces)
{
	km_record_iter it;
	km_record rec;
	*pieces = 0;
	if (b->control)
		return KM_ERR_INVAL;
	if (b->records_count == 0)
		return KM_OK;
	km_err err = km_batch_records(b, scratch, scratch_cap, &it);
	if (err)
		return err;
	/* Cap the count by the bytes that hold the records before allocating for them. */
	if ((size_t)b->records_count > it.rd.len / MIN_RECORD_SIZE)
		return KM_ERR_DECODE;

	/* First pass: validate everything and count headers; second pass: fill. */
	size_t nheaders = 0;
	km_record_iter it2 = it;
	while (km_record_next(&it2, &rec))
		nheaders += (size_t)rec.headers_count;
	if (it2.err)
		return it2.err;

	size_t n = (size_t)b->records_count;
	km_batch_record *recs = calloc(n, sizeof(*recs));
	km_record_header *hdrs = nheaders ? calloc(nheaders, sizeof(*hdrs)) : NULL;
	if (!recs || (nheaders && !hdrs)) {
		free(recs);
		free(hdrs);
		return KM_ERR_NOMEM;
	}
	size_t i = 0, h = 0;
	while (i < n && km_record_next(&it, &rec)) {
		km_batch_record *r = &recs[i++];
		/* The record's own timestamp as written, also under LogAppendTime (the flag is kept). */
		r->timestamp = add64(b->base_timestamp, rec.timestamp_delta);
		r->offset_delta = rec.offset_delta;
		r->key = rec.key;
		r->value = rec.value;
		r->headers = hdrs ? hdrs + h : NULL;
		r->headers_count = (size_t)rec.headers_count;
		if (rec.headers_count > 0) {
			km_record_header_iter hi;
			km_record_header_iter_init(&hi, &rec);
			while (km_record_header_next(&hi, &hdrs[h]))
				h++;
		}
	}

	/* Deltas that do not increase from >= 0 are not a batch Kafka writes. */
	for (size_t k = 0; k < n && !err; k++)
		if (recs[k].offset_delta < 0 || (k && recs[k].offset_delta <= recs[k - 1].offset_delta))
			err = KM_ERR_DECODE;

	size_t start_len = out->len;
	for (size_t s = 0; s < n && !err;) {
		size_t e = s + 1;
		/* A run: offset deltas that follow each other (deltas from the wire may be anything). */
		while (e < n && (int64_t)recs[e].offset_delta == (int64_t)recs[e - 1].offset_delta + 1)
			e++;
		int32_t first = recs[s].offset_delta;
		for (size_t k = s; k < e; k++)
			recs[k].offset_delta -= first;
		km_batch_params p;
		km_batch_params_init(&p);
		p.codec = b->codec;
		p.base_offset = add64(b->base_offset, first);
		p.partition_leader_epoch = b->partition_leader_epoch;
		p.producer_id = b->producer_id;
		p.producer_epoch = b->producer_epoch;
		p.base_sequence = b->base_sequence >= 0 ? km_batch_seq_add(b->base_sequence, first) : b->base_sequence;
		p.transactional = b->transactional;
		p.log_append_time = b->log_append_time;
		p.max_timestamp = b->max_timestamp;
		err = km_batch_build(&p, recs + s, e - s, out);
		if (!err)
			(*pieces)++;
		s = e;
	}
	free(recs);
	free(hdrs);
	if (err) {
		if (km_wr_ok(out))
			out->len = start_len;
		*pieces = 0;
	}
	return err;
}

km_err km_batch_append_time_as_create(const km_batch *b, uint8_t *scratch, size_t scratch_cap,
				      uint8_t hdr[KM_BATCH_HEADER_SIZE])
{
	km_record_iter it;
	km_record rec;
	int64_t max_delta = INT64_MIN;
	uint16_t attr;
	km_err err;

	if (!b->log_append_time || b->control || b->records_count <= 0)
		return KM_ERR_INVAL;
	if ((err = km_batch_records(b, scratch, scratch_cap, &it)) != KM_OK)
		return err;
	while (km_record_next(&it, &rec))
		if (rec.timestamp_delta > max_delta)
			max_delta = rec.timestamp_delta;
	if (it.err)
		return it.err;
	if (max_delta == INT64_MIN)
		return KM_ERR_DECODE;
	/* Every record then reads at most MaxTimestamp, the largest exactly it: the broker keeps the header. */
	km_put_be64(hdr + KM_BATCH_OFF_BASE_TIMESTAMP, (uint64_t)sub64(b->max_timestamp, max_delta));
	attr = (uint16_t)(b->attributes & ~(KM_BATCH_ATTR_LOG_APPEND_TIME | KM_BATCH_ATTR_DELETE_HORIZON));
	km_put_be16(hdr + KM_BATCH_OFF_ATTRIBUTES, attr);
	return KM_OK;
}
