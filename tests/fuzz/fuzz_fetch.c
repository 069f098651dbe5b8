/*
 * libFuzzer harness: the streaming Fetch walker (kmirror/fetch.h) over a response that arrives in
 * chains of random sizes, sent on as the proxy does, some partitions descended into and their batch
 * prefixes patched; whenever the generated decoder accepts the frame, the walk must agree with it.
 *
 * Input: a version byte (4 + b % 15), 3 bytes seeding the piece sizes and choices (fuzz_split.h),
 * then the frame after its size prefix (correlation id, header tags from v12, body).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_split.h"
#include "kmirror/fetch.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/response_header.h"
#include "kmirror/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_PARTS 4096
#define MAX_PATCHES 4096

static km_fetch_part parts[MAX_PARTS];
static size_t patches[MAX_PATCHES];

static void die(const char *what, int16_t v)
{
	fprintf(stderr, "fuzz_fetch: Fetch v%d: %s\n", v, what);
	abort();
}

/* Whether frame[at, end) is exactly one tagged-field section. */
static bool tags_to_end(const uint8_t *frame, size_t at, size_t end)
{
	km_rd r;
	uint32_t n, tag, sz;
	km_rd_init(&r, frame + at, end - at);
	if (!km_rd_uvarint(&r, "tags", &n))
		return false;
	for (uint32_t i = 0; i < n; i++)
		if (!km_rd_uvarint(&r, "tag", &tag) || !km_rd_uvarint(&r, "size", &sz) || !km_rd_skip(&r, "value", sz))
			return false;
	return r.pos == r.len;
}

/* The walk's view of each partition against the decoder's. */
static void compare(const km_fetch_response *m, const uint8_t *frame, size_t nparts, int16_t v)
{
	size_t k = 0;
	for (int32_t i = 0; i < m->responses.count; i++) {
		const km_fetch_response_fetchable_topic_response *t = &m->responses.items[i];
		for (int32_t j = 0; j < t->partitions.count; j++, k++) {
			const km_fetch_response_partition_data *d = &t->partitions.items[j];
			const km_fetch_part *p = &parts[k];
			if (k >= nparts)
				die("the walk saw fewer partitions than the decoder", v);
			if (k >= MAX_PARTS)
				continue;
			if (p->topic_index != (uint32_t)i || p->partition != d->partition_index ||
			    p->error_code != d->error_code || p->high_watermark != d->high_watermark ||
			    p->last_stable_offset != d->last_stable_offset ||
			    p->log_start_offset != (v >= 5 ? d->log_start_offset : -1))
				die("partition fields differ from the decoder's", v);
			if (p->aborted_count != d->aborted_transactions.count)
				die("aborted transaction count differs", v);
			if (p->records_len != (size_t)(d->records.len > 0 ? d->records.len : 0) ||
			    (d->records.len > 0 && p->records_off != (size_t)(d->records.p - frame)))
				die("records differ from the decoder's", v);
			if (v >= 13 ? memcmp(p->topic_id.b, t->topic_id.b, 16) != 0
				    : (strlen(p->topic) != (size_t)(t->topic.len > 0 ? t->topic.len : 0) ||
				       (t->topic.len > 0 && memcmp(p->topic, t->topic.p, (size_t)t->topic.len) != 0)))
				die("topic differs from the decoder's", v);
		}
	}
	if (k != nparts)
		die("the walk saw more partitions than the decoder", v);
}

/*
 * Whether a name the walk refuses by design is in the response: too long for km_fetch_part.topic,
 * or holding a NUL byte (it would read as another name). Kafka makes neither.
 */
static bool odd_name(const km_fetch_response *m, int16_t v)
{
	for (int32_t i = 0; v < 13 && i < m->responses.count; i++) {
		km_str t = m->responses.items[i].topic;
		if (t.len >= (int32_t)sizeof(parts[0].topic) || (t.len > 0 && memchr(t.p, 0, (size_t)t.len)))
			return true;
	}
	return false;
}

/* The generated decoder's verdict over the whole frame (m decoded into a). */
static bool decoder_accepts(const uint8_t *frame, size_t len, int16_t v, km_fetch_response *m, km_arena *a)
{
	km_response_header h;
	km_rd r;

	km_rd_init(&r, frame + 4, len - 4);
	km_response_header_init(&h);
	km_fetch_response_init(m);
	if (km_response_header_decode(&r, v >= 12 ? 1 : 0, &h, a) != KM_OK || km_fetch_response_decode(&r, v, m, a) != KM_OK ||
	    r.pos != r.len || odd_name(m, v))
		return false;
	/* Borrowed pointers must point into the frame. */
	for (int32_t i = 0; i < m->responses.count; i++)
		for (int32_t j = 0; j < m->responses.items[i].partitions.count; j++) {
			const km_bytes *b = &m->responses.items[i].partitions.items[j].records;
			if (b->len > 0 && (b->p < frame || b->p + b->len > frame + len))
				die("the decoder borrowed bytes outside the frame", v);
		}
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	km_fetch_response m;
	km_fuzz_rng g;
	km_fetch_walk w;
	km_arena a;
	struct evbuffer *in;
	uint8_t *frame, *out;
	size_t len, fed = 0, sent = 0, nparts = 0, npatches = 0;
	bool accepted;
	km_fw_event ev;
	int16_t v;

	if (size < 4 || size - 4 > (size_t)INT32_MAX - 4)
		return 0;
	v = (int16_t)(KM_FETCH_RESPONSE_MIN_VERSION + data[0] % (KM_FETCH_RESPONSE_MAX_VERSION - KM_FETCH_RESPONSE_MIN_VERSION + 1));
	if (!km_fetch_walk_supported(v))
		die("a codec version the walker does not know", v);
	km_fuzz_rng_init(&g, data + 1);
	len = 4 + (size - 4);
	frame = malloc(len);
	out = malloc(len);
	km_put_be32(frame, (uint32_t)(size - 4));
	memcpy(frame + 4, data + 4, size - 4);

	km_arena_init(&a, 16 << 20);
	accepted = decoder_accepts(frame, len, v, &m, &a);

	in = evbuffer_new();
	km_fetch_walk_init(&w, v, len);
	for (;;) {
		ev = km_fetch_walk_next(&w, in, sent);
		if (ev == KM_FW_ERROR)
			break;
		if (ev == KM_FW_PARTITION) {
			const km_fetch_part *p = &w.part;
			if (p->records_off + p->records_len > len || p->high_watermark_off + 16 > p->records_off ||
			    (int64_t)km_be64(frame + p->high_watermark_off) != p->high_watermark ||
			    (int64_t)km_be64(frame + p->high_watermark_off + 8) != p->last_stable_offset)
				die("a partition's offsets do not point at its fields", v);
			if (p->aborted_count > 0 && p->aborted_off + 16 * (size_t)p->aborted_count > p->records_off)
				die("aborted transactions beyond the records", v);
			if (nparts < MAX_PARTS)
				parts[nparts] = *p;
			nparts++;
			w.descend = km_fuzz_next(&g) & 1;
			continue;
		}
		if (ev == KM_FW_BATCH) {
			uint8_t nb[8];
			if (w.batch.off < sent || w.batch.off >= w.records_end || w.pos > w.records_end)
				die("a batch outside its partition's records", v);
			if (w.batch.partial)
				continue;
			if (w.batch.off + 12 + (size_t)w.batch.length != w.pos ||
			    (int64_t)km_be64(frame + w.batch.off) != w.batch.base_offset)
				die("a batch prefix that is not where the walk stands", v);
			km_put_be64(nb, (uint64_t)w.batch.base_offset ^ 1);
			if (!km_evbuf_patch(in, w.batch.off - sent, nb, 8))
				die("a batch prefix that has not arrived", v);
			if (npatches < MAX_PATCHES)
				patches[npatches++] = w.batch.off;
			continue;
		}
		if (ev == KM_FW_END) {
			if (w.pos < sent || w.pos > len || (v < 12 && w.pos != len))
				die("the end is not where the top-level tags start", v);
			if (fed < len) {
				km_fuzz_add_split(in, &g, frame + fed, len - fed);
				fed = len;
			}
			if (evbuffer_get_length(in) != len - sent)
				die("bytes lost on the way", v);
			evbuffer_remove(in, out + sent, len - sent);
			sent = len;
			break;
		}
		/* NEED_MORE: everything before w.pos is settled and goes on. */
		{
			size_t have_end = sent + evbuffer_get_length(in), upto = w.pos < have_end ? w.pos : have_end, n;
			if (fed == len)
				die("more bytes asked for after the whole frame", v);
			if (upto > sent) {
				evbuffer_remove(in, out + sent, upto - sent);
				sent = upto;
			}
			n = km_fuzz_chunk(&g, len - fed);
			km_fuzz_add_chain(in, frame + fed, n);
			fed += n;
		}
	}

	if (accepted) {
		if (ev != KM_FW_END)
			die("the decoder accepts what the walk refuses", v);
		compare(&m, frame, nparts, v);
		if (v >= 12 && !tags_to_end(frame, w.pos, len))
			die("the end is not a tagged-field section", v);
	}
	if (ev == KM_FW_END) {
		/* What went on is the frame, with only the patched base offsets changed. */
		for (size_t i = 0; i < npatches; i++)
			frame[patches[i] + 7] ^= 1;
		if (npatches < MAX_PATCHES && memcmp(out, frame, len) != 0)
			die("the bytes sent on differ from the frame beyond the patches", v);
	}
	evbuffer_free(in);
	km_arena_free(&a);
	free(frame);
	free(out);
	return 0;
}
