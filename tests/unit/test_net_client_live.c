/* The async client against a real broker (KM_TEST_BOOTSTRAP=host:port, KM_TEST_TOPIC, KM_TEST_TOPIC2, KM_TEST_SASL_*): negotiation, a streamed Fetch, a Produce from referenced batches, backpressure, SASL. Skips without them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/uio.h>
#include <cmocka.h>

#include "kmirror/api.h"
#include "kmirror/arena.h"
#include "kmirror/batch.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/fetch_request.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/init_producer_id_request.h"
#include "kmirror/msg/init_producer_id_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/msg/produce_request.h"
#include "kmirror/msg/produce_response.h"
#include "kmirror/net.h"

#define STREAM_CAP (1024 * 1024)        /* unreleased bytes the fetch client may hold */
#define BUFFERED_LIMIT (4 * 1024 * 1024) /* what the test allows in the socket input at once */
#define KEEP 24                          /* batches kept from the fetch to produce again */

static const char *bootstrap, *topic, *topic2;
static struct event_base *base;

typedef struct state_probe {
	int states;
	km_err err;
	int writable;
} state_probe;

static void on_state(km_net_client *c, km_err err, void *arg)
{
	state_probe *s = arg;
	s->states++;
	s->err = err;
}

typedef struct producer_run producer_run;
static producer_run *pumping;
static void pump(producer_run *pr);

static void on_writable(km_net_client *c, void *arg)
{
	((state_probe *)arg)->writable++;
	if (pumping)
		pump(pumping);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Run the loop until *flag becomes true, for at most seconds. */
static void wait_for(const bool *flag, double seconds)
{
	double end = now_s() + seconds;
	while (!*flag && now_s() < end) {
		struct timeval tv = {0, 20000};
		event_base_loopexit(base, &tv);
		event_base_dispatch(base);
	}
	assert_true(*flag);
}

static bool ready_flag(const state_probe *s)
{
	return s->states > 0;
}

/* A client to addr (host:port) with o; waits for its first state change (KM_OK or the error). */
static km_net_client *open_client(const char *addr, state_probe *s, km_net_client_opts *o)
{
	char host[256];
	const char *colon = strrchr(addr, ':');
	km_net_client *c;

	assert_non_null(colon);
	snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
	o->client_id = "kmirror-live-test";
	o->request_timeout_ms = 60000;
	o->max_frame_bytes = 256 * 1024 * 1024;
	o->on_state = on_state;
	o->on_writable = on_writable;
	o->arg = s;
	c = km_net_client_new(base, o);
	assert_non_null(c);
	assert_int_equal(km_net_client_connect(c, host, (uint16_t)atoi(colon + 1)), KM_OK);
	for (int i = 0; i < 500 && !ready_flag(s); i++) {
		struct timeval tv = {0, 20000};
		event_base_loopexit(base, &tv);
		event_base_dispatch(base);
	}
	assert_int_equal(s->states, 1);
	return c;
}

static km_net_client *connect_client(state_probe *s, km_net_client_opts *o)
{
	km_net_client *c = open_client(bootstrap, s, o);
	assert_int_equal(s->err, KM_OK);
	return c;
}

/* ---- a flat request built with the generated codec ---- */

typedef struct flat_reply {
	bool done;
	km_err err;
	uint8_t *body;
	size_t len;
} flat_reply;

static void on_flat(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	flat_reply *f = arg;
	f->err = err;
	if (body) {
		f->body = malloc(len ? len : 1);
		memcpy(f->body, body, len);
		f->len = len;
	}
	f->done = true;
}

/* Send w's bytes (copied) as the body of rq, whose delivery and callback are set. */
static void send_body(km_net_client *c, km_net_request *rq, const km_wr *w)
{
	km_net_piece pc = {.p = w->buf, .len = w->len};
	rq->pieces = &pc;
	rq->npieces = 1;
	assert_int_equal(km_net_client_request(c, rq), KM_OK);
	rq->pieces = NULL;
	rq->npieces = 0;
}

static void call(km_net_client *c, int16_t key, int16_t v, const km_wr *w, flat_reply *f)
{
	km_net_request rq;
	memset(f, 0, sizeof(*f));
	km_net_request_init(&rq, key, v);
	rq.delivery = KM_NET_FLAT;
	rq.on_flat = on_flat;
	rq.arg = f;
	send_body(c, &rq, w);
	wait_for(&f->done, 60);
	assert_int_equal(f->err, KM_OK);
}

/* Topic id of a topic, from Metadata at the negotiated version. */
static km_uuid topic_id(km_net_client *c, const char *name)
{
	int16_t v = km_net_client_version(c, KM_API_METADATA);
	km_metadata_request m;
	km_metadata_request_topic t;
	km_metadata_response r;
	km_arena a;
	km_rd rd;
	km_wr w;
	flat_reply f;
	km_uuid id;

	km_metadata_request_init(&m);
	km_metadata_request_topic_init(&t);
	t.name = km_str_c(name);
	m.topics.items = &t;
	m.topics.count = 1;
	km_wr_init(&w);
	km_metadata_request_encode(&w, v, &m);
	assert_true(km_wr_ok(&w));
	call(c, KM_API_METADATA, v, &w, &f);
	km_wr_free(&w);
	km_arena_init(&a, 1 << 20);
	km_rd_init(&rd, f.body, f.len);
	assert_int_equal(km_metadata_response_decode(&rd, v, &r, &a), KM_OK);
	assert_int_equal(r.topics.count, 1);
	assert_int_equal(r.topics.items[0].error_code, 0);
	id = r.topics.items[0].topic_id;
	km_arena_free(&a);
	free(f.body);
	return id;
}

static void encode_fetch(km_wr *w, int16_t v, km_uuid id, const char *name, int64_t offset, int32_t max_bytes)
{
	km_fetch_request m;
	km_fetch_request_fetch_topic t;
	km_fetch_request_fetch_partition p;

	km_fetch_request_init(&m);
	km_fetch_request_fetch_topic_init(&t);
	km_fetch_request_fetch_partition_init(&p);
	m.max_wait_ms = 500;
	m.min_bytes = 1;
	m.max_bytes = max_bytes;
	p.partition = 0;
	p.fetch_offset = offset;
	p.partition_max_bytes = max_bytes;
	t.topic = km_str_c(name);
	t.topic_id = id;
	t.partitions.items = &p;
	t.partitions.count = 1;
	m.topics.items = &t;
	m.topics.count = 1;
	km_wr_init(w);
	km_fetch_request_encode(w, v, &m);
	assert_true(km_wr_ok(w));
}

/* ---- a streamed Fetch: the consumer walks the response as it arrives and releases what it used ---- */

typedef enum { S_PREFIX, S_RECORDS, S_TAIL } stream_part;

typedef struct consumer {
	km_net_client *c;
	struct evbuffer *acc; /* delivered bytes not consumed yet */
	stream_part part;
	size_t records_left;
	int16_t partition_error;
	int64_t high_watermark, next_offset;
	uint64_t record_bytes, records, batches, response_bytes;
	struct evbuffer *kept[KEEP];
	int nkept;
	bool done;
	km_err err;
} consumer;

static bool evrd_i64(km_evrd *r)
{
	return km_evrd_skip(r, 8);
}

/* Fetch response fields up to the partition's records (flexible versions, one topic, one partition). */
static bool parse_prefix(consumer *k)
{
	km_evrd r;
	int16_t ec;
	int32_t i32;
	uint32_t n, records_len;
	uint8_t hw[8];

	km_evrd_init(&r, k->acc, 0, evbuffer_get_length(k->acc));
	if (!km_evrd_i32(&r, &i32) || !km_evrd_i16(&r, &ec) || !km_evrd_i32(&r, &i32) || !km_evrd_uvarint(&r, &n))
		return false;
	assert_int_equal(ec, 0);
	assert_int_equal(n, 2); /* one topic */
	if (!km_evrd_skip(&r, 16) || !km_evrd_uvarint(&r, &n))
		return false;
	assert_int_equal(n, 2); /* one partition */
	if (!km_evrd_i32(&r, &i32) || !km_evrd_i16(&r, &k->partition_error) || !km_evrd_raw(&r, hw, 8) ||
	    !evrd_i64(&r) || !evrd_i64(&r) || !km_evrd_uvarint(&r, &n))
		return false;
	for (uint32_t i = 1; i < n; i++) /* aborted transactions: producer id, first offset, tags */
		if (!km_evrd_skip(&r, 16) || !km_evrd_skip_tags(&r))
			return false;
	if (!km_evrd_i32(&r, &i32) || !km_evrd_uvarint(&r, &records_len))
		return false;
	k->high_watermark = (int64_t)km_be64(hw);
	k->records_left = records_len ? records_len - 1 : 0;
	evbuffer_drain(k->acc, r.pos);
	km_net_client_release(k->c, r.pos);
	k->part = S_RECORDS;
	return true;
}

/* Whole batches from acc: parse, verify the CRC, read every record; keep some for the produce. */
static void consume_batches(consumer *k)
{
	while (k->records_left >= 12 && evbuffer_get_length(k->acc) >= 12) {
		uint8_t h[12];
		size_t size;
		struct evbuffer *one;
		const uint8_t *p;
		uint8_t *copy = NULL;
		km_batch b;
		km_record_iter it;
		km_record rec;
		uint64_t n = 0;

		evbuffer_copyout(k->acc, h, 12);
		size = 12 + (size_t)km_be32(h + 8);
		if (size > k->records_left) {
			k->part = S_TAIL; /* the last batch was cut at the byte limit */
			return;
		}
		if (evbuffer_get_length(k->acc) < size)
			return;
		one = evbuffer_new();
		assert_int_equal(evbuffer_remove_buffer(k->acc, one, size), (int)size);
		/* The iterator wants a batch contiguous; a kept one stays in its receive chains (a copy is checked). */
		if (k->nkept < KEEP) {
			copy = malloc(size);
			assert_int_equal(evbuffer_copyout(one, copy, size), (ev_ssize_t)size);
			p = copy;
		} else {
			p = evbuffer_pullup(one, -1);
		}
		assert_int_equal(km_batch_parse(p, size, &b), KM_OK);
		assert_int_equal(km_batch_verify_crc(p, size), KM_OK);
		assert_int_equal(b.base_offset, k->next_offset);
		assert_int_equal(km_batch_records(&b, NULL, 0, &it), KM_OK);
		while (km_record_next(&it, &rec))
			n++;
		assert_int_equal(it.err, KM_OK);
		assert_int_equal(n, (uint64_t)b.records_count);
		k->records += n;
		k->batches++;
		k->record_bytes += size;
		k->next_offset = b.base_offset + b.last_offset_delta + 1;
		k->records_left -= size;
		if (k->nkept < KEEP)
			k->kept[k->nkept++] = one;
		else
			evbuffer_free(one);
		free(copy);
		km_net_client_release(k->c, size);
	}
	if (k->records_left < 12)
		k->part = S_TAIL;
}

static void on_fetch_chunk(km_net_client *c, km_err err, struct evbuffer *chunk, size_t off, bool last, void *arg)
{
	consumer *k = arg;
	if (err != KM_OK) {
		k->err = err;
		k->done = true;
		return;
	}
	assert_int_equal(off, k->response_bytes);
	k->response_bytes += evbuffer_get_length(chunk);
	evbuffer_add_buffer(k->acc, chunk);
	if (k->part == S_PREFIX && !parse_prefix(k))
		assert_true(evbuffer_get_length(k->acc) < 65536 && !last);
	if (k->part == S_RECORDS)
		consume_batches(k);
	if (k->part == S_TAIL) {
		size_t n = evbuffer_get_length(k->acc);
		evbuffer_drain(k->acc, n);
		km_net_client_release(c, n);
	}
	if (last) {
		assert_int_equal(evbuffer_get_length(k->acc), 0);
		k->done = true;
	}
}

/* ---- Produce from referenced batches: restamped header copied, payload referenced in the fetch buffers ---- */

struct producer_run {
	km_net_client *c;
	consumer *k;
	km_uuid id;
	int16_t version;
	int64_t pid;
	int16_t epoch;
	uint8_t hdr[KEEP][KM_BATCH_HEADER_SIZE];
	int32_t seq[KEEP];
	int next, answered, errors, full, released, chains_split;
	bool done;
};

static void count_release(void *arg)
{
	((producer_run *)arg)->released++;
}

static void on_produce(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	producer_run *pr = arg;
	km_produce_response r;
	km_arena a;
	km_rd rd;

	pr->answered++;
	if (err != KM_OK) {
		pr->errors++;
	} else {
		km_arena_init(&a, 1 << 20);
		km_rd_init(&rd, body, len);
		if (km_produce_response_decode(&rd, pr->version, &r, &a) != KM_OK || r.responses.count != 1 ||
		    r.responses.items[0].partition_responses.count != 1 ||
		    r.responses.items[0].partition_responses.items[0].error_code != 0) {
			fprintf(stderr, "produce %d failed: %s\n", pr->answered,
				r.responses.count == 1 && r.responses.items[0].partition_responses.count == 1
					? km_err_name(r.responses.items[0].partition_responses.items[0].error_code)
					: "undecodable");
			pr->errors++;
		}
		km_arena_free(&a);
	}
	pr->done = pr->answered == KEEP;
}

static km_err send_produce(producer_run *pr, int i)
{
	static const uint8_t marker[16] = "@@records-here@@";
	struct evbuffer *b = pr->k->kept[i];
	size_t size = evbuffer_get_length(b), pos;
	km_produce_request m;
	km_produce_request_topic_produce_data t;
	km_produce_request_partition_produce_data pd;
	uint8_t lenbuf[5];
	km_wr w, lw;
	km_net_piece pc[5];
	km_net_request rq;
	km_err rc;
	const uint8_t *at;

	km_produce_request_init(&m);
	km_produce_request_topic_produce_data_init(&t);
	km_produce_request_partition_produce_data_init(&pd);
	m.acks = -1;
	m.timeout_ms = 30000;
	t.name = km_str_c(topic2);
	t.topic_id = pr->id;
	pd.index = 0;
	pd.records = (km_bytes){marker, sizeof(marker)};
	t.partition_data.items = &pd;
	t.partition_data.count = 1;
	m.topic_data.items = &t;
	m.topic_data.count = 1;
	km_wr_init(&w);
	km_produce_request_encode(&w, pr->version, &m);
	assert_true(km_wr_ok(&w));
	/* The records field is the marker: cut the body around it and its compact length. */
	for (pos = 0; pos + sizeof(marker) <= w.len && memcmp(w.buf + pos, marker, sizeof(marker)); pos++)
		;
	assert_true(pos + sizeof(marker) <= w.len);
	at = w.buf + pos;
	assert_int_equal(w.buf[pos - 1], sizeof(marker) + 1);
	km_wr_init_fixed(&lw, lenbuf, sizeof(lenbuf));
	km_wr_uvarint(&lw, (uint32_t)size + 1);
	memset(pc, 0, sizeof(pc));
	pc[0] = (km_net_piece){.p = w.buf, .len = pos - 1};
	pc[1] = (km_net_piece){.p = lenbuf, .len = lw.len};
	pc[2] = (km_net_piece){.p = pr->hdr[i], .len = KM_BATCH_HEADER_SIZE, .release = count_release, .release_arg = pr};
	pc[3] = (km_net_piece){.buf = b, .off = KM_BATCH_HEADER_SIZE, .len = size - KM_BATCH_HEADER_SIZE,
			       .release = count_release, .release_arg = pr};
	pc[4] = (km_net_piece){.p = at + sizeof(marker), .len = w.len - pos - sizeof(marker)};
	km_net_request_init(&rq, KM_API_PRODUCE, pr->version);
	rq.pieces = pc;
	rq.npieces = 5;
	rq.delivery = KM_NET_FLAT;
	rq.on_flat = on_produce;
	rq.arg = pr;
	rc = km_net_client_request(pr->c, &rq);
	km_wr_free(&w);
	return rc;
}

/* Send until the in-flight cap says KM_ERR_FULL; on_writable calls it again. */
static void pump(producer_run *pr)
{
	while (pr->next < KEEP) {
		km_err rc = send_produce(pr, pr->next);
		if (rc == KM_ERR_FULL) {
			pr->full++;
			return;
		}
		assert_int_equal(rc, KM_OK);
		pr->next++;
	}
}

static void init_producer_id(km_net_client *c, producer_run *pr)
{
	int16_t v = km_net_client_version(c, KM_API_INIT_PRODUCER_ID);
	km_init_producer_id_request m;
	km_init_producer_id_response r;
	km_arena a;
	km_rd rd;
	km_wr w;
	flat_reply f;

	km_init_producer_id_request_init(&m);
	m.transactional_id = KM_STR_NULL;
	m.transaction_timeout_ms = 60000;
	m.producer_id = -1;
	m.producer_epoch = -1;
	km_arena_init(&a, 1 << 16);
	/* A fresh broker may answer COORDINATOR_LOAD_IN_PROGRESS (retriable) for a while. */
	for (int attempt = 0; attempt < 150; attempt++) {
		km_wr_init(&w);
		km_init_producer_id_request_encode(&w, v, &m);
		assert_true(km_wr_ok(&w));
		call(c, KM_API_INIT_PRODUCER_ID, v, &w, &f);
		km_wr_free(&w);
		km_arena_reset(&a);
		km_rd_init(&rd, f.body, f.len);
		assert_int_equal(km_init_producer_id_response_decode(&rd, v, &r, &a), KM_OK);
		free(f.body);
		if (!km_err_retriable(r.error_code))
			break;
		{
			struct timeval tv = {0, 200000};
			event_base_loopexit(base, &tv);
			event_base_dispatch(base);
		}
	}
	assert_int_equal(r.error_code, 0);
	assert_true(r.producer_id >= 0);
	pr->pid = r.producer_id;
	pr->epoch = r.producer_epoch;
	km_arena_free(&a);
}

/* Restamp every kept batch as the new producer, over its receive chains (not contiguous). */
static void restamp_kept(producer_run *pr)
{
	int32_t seq = 0;
	for (int i = 0; i < KEEP; i++) {
		struct evbuffer *b = pr->k->kept[i];
		int n = evbuffer_peek(b, -1, NULL, NULL, 0);
		struct evbuffer_iovec *ev = calloc((size_t)n, sizeof(*ev));
		struct iovec *v = calloc((size_t)n, sizeof(*v));
		uint32_t crc;

		assert_int_equal(evbuffer_peek(b, -1, NULL, ev, n), n);
		for (int j = 0; j < n; j++)
			v[j] = (struct iovec){ev[j].iov_base, ev[j].iov_len};
		pr->chains_split += n > 1;
		pr->seq[i] = seq;
		assert_int_equal(km_batch_restamp_iov(v, (size_t)n, pr->hdr[i], pr->pid, pr->epoch, seq, &crc), KM_OK);
		seq += (int32_t)km_be32(pr->hdr[i] + KM_BATCH_OFF_RECORDS_COUNT);
		free(ev);
		free(v);
	}
}

typedef struct owned_reply {
	bool done;
	km_err err;
	struct evbuffer *body;
} owned_reply;

static void on_owned(km_net_client *c, km_err err, struct evbuffer *body, void *arg)
{
	owned_reply *o = arg;
	o->err = err;
	o->body = body;
	o->done = true;
}

/* Fetch the produced topic back (owned delivery) and compare every batch with its source. */
static void verify_produced(km_net_client *c, producer_run *pr, int16_t vf)
{
	km_fetch_response r;
	km_arena a;
	km_rd rd;
	km_wr w;
	km_net_request rq;
	owned_reply o = {0};
	km_batch_iter it;
	km_batch b;
	const km_fetch_response_partition_data *pd;
	const uint8_t *body;
	int n = 0;

	encode_fetch(&w, vf, pr->id, topic2, 0, 64 * 1024 * 1024);
	km_net_request_init(&rq, KM_API_FETCH, vf);
	rq.delivery = KM_NET_OWNED;
	rq.on_owned = on_owned;
	rq.arg = &o;
	send_body(c, &rq, &w);
	km_wr_free(&w);
	wait_for(&o.done, 60);
	assert_int_equal(o.err, KM_OK);
	body = evbuffer_pullup(o.body, -1);
	km_arena_init(&a, 1 << 20);
	km_rd_init(&rd, body, evbuffer_get_length(o.body));
	assert_int_equal(km_fetch_response_decode(&rd, vf, &r, &a), KM_OK);
	pd = &r.responses.items[0].partitions.items[0];
	assert_int_equal(pd->error_code, 0);
	km_batch_iter_init(&it, pd->records.p, (size_t)pd->records.len);
	while (km_batch_next(&it, &b) && n < KEEP) {
		struct evbuffer *src = pr->k->kept[n];
		size_t size = evbuffer_get_length(src);
		const uint8_t *orig = evbuffer_pullup(src, -1);
		assert_int_equal(km_batch_verify_crc(b.data, b.size), KM_OK);
		assert_int_equal(b.size, size);
		assert_int_equal(b.producer_id, pr->pid);
		assert_int_equal(b.base_sequence, pr->seq[n]);
		assert_int_equal(b.records_count, (int32_t)km_be32(orig + KM_BATCH_OFF_RECORDS_COUNT));
		/* the records, byte for byte the source's */
		assert_memory_equal(b.records, orig + KM_BATCH_HEADER_SIZE, size - KM_BATCH_HEADER_SIZE);
		n++;
	}
	assert_int_equal(it.err, KM_OK);
	assert_int_equal(n, KEEP);
	km_arena_free(&a);
	evbuffer_free(o.body);
}

static void test_live(void **state)
{
	km_net_client_opts o;
	km_net_client_stats st;
	state_probe sp = {0}, sp2 = {0};
	km_net_client *c, *p;
	consumer k;
	km_uuid id, id2;
	int16_t vf, vp;
	uint64_t largest = 0;
	double t0, dt;
	int fetches = 0;

	if (!bootstrap || !topic || !topic2)
		skip();
	base = event_base_new();

	/* 1. Negotiation against the broker. */
	memset(&o, 0, sizeof(o));
	o.max_unreleased_bytes = STREAM_CAP;
	c = connect_client(&sp, &o);
	vf = km_net_client_version(c, KM_API_FETCH);
	vp = km_net_client_version(c, KM_API_PRODUCE);
	printf("# negotiated: ApiVersions %d, Fetch %d, Produce %d, Metadata %d, InitProducerId %d; metadata.version %d\n",
	       km_net_client_version(c, KM_API_API_VERSIONS), vf, vp, km_net_client_version(c, KM_API_METADATA),
	       km_net_client_version(c, KM_API_INIT_PRODUCER_ID), km_net_client_feature(c, "metadata.version"));
	assert_true(vf >= 17 && vf <= km_api_lookup(KM_API_FETCH)->max_version);
	assert_true(vp >= 12 && vp <= km_api_lookup(KM_API_PRODUCE)->max_version);
	assert_true(km_net_client_version(c, KM_API_METADATA) >= 12);
	assert_true(km_net_client_version(c, KM_API_API_VERSIONS) >= 3);
	assert_true(km_net_client_feature(c, "metadata.version") > 0);
	assert_int_equal(km_net_client_version(c, 9999), -1);
	id = topic_id(c, topic);
	id2 = topic_id(c, topic2);

	/* 2. Fetch the whole partition, streamed, with memory bounded by the consumer's pace. */
	memset(&k, 0, sizeof(k));
	k.c = c;
	k.acc = evbuffer_new();
	t0 = now_s();
	do {
		km_wr w;
		km_net_request rq;
		uint64_t before = k.response_bytes;

		encode_fetch(&w, vf, id, topic, k.next_offset, 128 * 1024 * 1024);
		km_net_request_init(&rq, KM_API_FETCH, vf);
		rq.delivery = KM_NET_STREAM;
		rq.on_stream = on_fetch_chunk;
		rq.arg = &k;
		k.part = S_PREFIX;
		k.done = false;
		send_body(c, &rq, &w);
		km_wr_free(&w);
		wait_for(&k.done, 120);
		assert_int_equal(k.err, KM_OK);
		assert_int_equal(k.partition_error, 0);
		if (k.response_bytes - before > largest)
			largest = k.response_bytes - before;
		fetches++;
	} while (k.next_offset < k.high_watermark && fetches < 20);
	dt = now_s() - t0;
	km_net_client_stats_get(c, &st);
	printf("# fetch: %d response(s), largest %.1f MB, %.1f MB of batches (%llu batches, %llu records) in %.2f s; "
	       "peak buffered %zu bytes, peak unreleased %zu bytes\n",
	       fetches, largest / 1e6, k.record_bytes / 1e6, (unsigned long long)k.batches,
	       (unsigned long long)k.records, dt, st.peak_buffered, st.peak_unreleased);
	assert_int_equal(k.next_offset, k.high_watermark);
	assert_true(k.record_bytes >= 60000000);
	assert_true(largest >= 60000000); /* one response of that size, never buffered whole */
	assert_true(st.peak_buffered < BUFFERED_LIMIT);
	assert_true(st.peak_unreleased <= STREAM_CAP);
	assert_int_equal(st.unreleased, 0);
	assert_int_equal(k.nkept, KEEP);

	/* 3. Produce the kept batches again, as a new idempotent producer, from references, with at
	 * most 4 requests in flight: sends stop at KM_ERR_FULL and on_writable resumes them. */
	{
		producer_run *pr = calloc(1, sizeof(*pr));
		memset(&o, 0, sizeof(o));
		o.max_inflight = 4;
		p = connect_client(&sp2, &o);
		pr->c = p;
		pr->k = &k;
		pr->id = id2;
		pr->version = km_net_client_version(p, KM_API_PRODUCE);
		init_producer_id(p, pr);
		restamp_kept(pr);
		pumping = pr;
		t0 = now_s();
		pump(pr);
		assert_true(pr->full >= 1);
		assert_int_equal(km_net_client_inflight(p), 4);
		wait_for(&pr->done, 120);
		dt = now_s() - t0;
		pumping = NULL;
		printf("# produce: %d batches from references in %.2f s, %d refused with KM_ERR_FULL, on_writable %d "
		       "times, %d of %d batches spread over several chains, producer id %lld\n",
		       KEEP, dt, pr->full, sp2.writable, pr->chains_split, KEEP, (long long)pr->pid);
		assert_int_equal(pr->errors, 0);
		assert_int_equal(pr->next, KEEP);
		assert_true(sp2.writable >= 1);
		assert_int_equal(sp2.writable, pr->full);
		assert_int_equal(pr->released, 2 * KEEP); /* header and payload of each, once */
		verify_produced(p, pr, km_net_client_version(p, KM_API_FETCH));
		km_net_client_free(p);
		free(pr);
	}
	for (int i = 0; i < k.nkept; i++)
		evbuffer_free(k.kept[i]);
	evbuffer_free(k.acc);
	km_net_client_free(c);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

/* SASL after ApiVersions, every mechanism, against the broker's SASL listener; a bad password fails. */
static void test_live_sasl(void **state)
{
	static const char *mechs[] = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"};
	const char *addr = getenv("KM_TEST_SASL_BOOTSTRAP"), *user = getenv("KM_TEST_SASL_USER"),
		   *pass = getenv("KM_TEST_SASL_PASSWORD");

	if (!addr || !user || !pass || !topic)
		skip();
	base = event_base_new();
	for (int i = 0; i < 6; i++) {
		state_probe sp = {0};
		km_net_client_opts o;
		km_net_client *c;
		bool good = i < 3;

		memset(&o, 0, sizeof(o));
		o.sasl_mechanism = mechs[i % 3];
		o.sasl_username = user;
		o.sasl_password = good ? pass : "not-the-password";
		c = open_client(addr, &sp, &o);
		printf("# SASL %s, %s password: %s\n", mechs[i % 3], good ? "right" : "wrong", km_err_name(sp.err));
		if (good) {
			assert_int_equal(sp.err, KM_OK);
			assert_true(km_net_client_version(c, KM_API_METADATA) >= 12);
			(void)topic_id(c, topic); /* an authenticated request answered */
		} else {
			assert_int_equal(sp.err, KM_ERR_SASL);
			assert_false(km_net_client_ready(c));
		}
		km_net_client_free(c);
	}
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_live), cmocka_unit_test(test_live_sasl)};
	bootstrap = getenv("KM_TEST_BOOTSTRAP");
	topic = getenv("KM_TEST_TOPIC");
	topic2 = getenv("KM_TEST_TOPIC2");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
